"""The sum protocol's plan and the rules every protocol shares (the package docstring has the contract).

:class:`SumPlan` is what a run's ``aggregation`` option plans (:func:`plan_sum`): how the round's
sum travels, who adds the noise and the protocol's sizes. The run plan holds it
(:attr:`fedpriv.plan.RunPlan.sums`); the server's dispatch (server/app.py) and every node's
(client/app.py, client/secagg.py through its own run plan) read it, and nothing else reads the
trust model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fedpriv.errors import ConfigError
from fedpriv.sums.wire import Field, SecAggQuantization

SERVER, PARTIES = "server", "parties"  # who adds the noise: the server to the sum it sees, or each party a share


@dataclass(frozen=True)
class SumPlan:
    """How a run's sums travel, fixed before round 1 from public quantities (frozen: the server and
    every node derive it alike, :func:`plan_sum`).

    ``protocol``: the ``aggregation`` option; ``noise_by``: :data:`SERVER` or :data:`PARTIES` (the
    mechanism's ``client_noise``); ``sees``: what the server sees of a round; ``parties``: the
    participants of a secure sum (SecAgg+: the nodes; in process: the mechanism's shares), None
    for a clear sum; ``shares``/``threshold``: SecAgg+'s key shares per node and the shares that
    unmask one; ``quantization``: the run's fixed grid under central noise; ``field``: ``(Q, c, M)``
    Flower's quantizer runs with; ``node_clip``: each user's bound on its node under central noise
    (None: the mechanism's clip); ``timeout``: seconds each SecAgg+ stage waits (None: no limit)."""

    protocol: str
    noise_by: str
    sees: str
    parties: int | None = None
    shares: int | None = None
    threshold: int | None = None
    quantization: SecAggQuantization | None = None
    field: Field | None = None
    node_clip: float | None = None
    timeout: float | None = None


def plan_sum(spec, mechanism, dimension: int, expected_cohort: float) -> SumPlan:
    """The :class:`SumPlan` of the checked config ``spec`` (its ``aggregation`` option's
    :meth:`~fedpriv.schema.SumOption.plan`) for the run's key-less ``mechanism`` at its σ, the
    model's ``dimension`` and the sampler's expected cohort: the one function the server's run plan
    and every node's call (``ConfigError`` where the protocol cannot hold the run)."""
    option = spec.aggregation
    by = who_adds_noise(mechanism)
    if by not in option.noise_by:
        raise ConfigError(f"aggregation={option.name} cannot serve mechanism={mechanism.name}: its noise is added by "
                          f"the {by}, and this protocol lets only the {' or '.join(option.noise_by)}")
    try:
        return option.plan(spec, mechanism, dimension, expected_cohort)
    except ValueError as err:
        raise ConfigError(f"aggregation={option.name}: {err}") from None


def resolved_mechanism(spec):
    """``spec``'s mechanism option with what it leaves to the sum protocol taken from ``spec``
    (:meth:`fedpriv.schema.SumOption.resolved_mechanism`: over SecAgg+ ddgauss's parties are the nodes)."""
    return spec.aggregation.resolved_mechanism(spec)


def who_adds_noise(mechanism) -> str:
    """Who adds ``mechanism``'s noise (a built mechanism, or its option): its ``client_noise``."""
    return PARTIES if mechanism.client_noise else SERVER


def party_codec(plan: SumPlan, mechanism):
    """The parties' codec of ``mechanism`` (its distributed encoding) where they add the noise, else None."""
    return mechanism.codec() if plan.noise_by == PARTIES else None


def check_query(plan: SumPlan, query, optimizer: str, mechanism: str) -> None:
    """Refuse (``ConfigError``) a server optimizer's query (:class:`fedpriv.round.queries.QueryPlan`) that
    reads what the protocol keeps from the server: under party noise the clear sum, each update's
    scale before clipping or the noise's scale; under a secure sum each user's update."""
    if plan.noise_by == PARTIES and (query.pre_clip_scale or query.noiseless or query.update_noise_factor != 1.0):
        raise ConfigError(f"optimizer={optimizer} reads or rescales what mechanism={mechanism} leaves to the "
                          "parties (each update scaled before clipping, the noise's scale, or the clear sum): the "
                          "server sees only their secure sum; use optimizer=sgd, momentum, ftrl, adam or "
                          "dpadam_post")
    if plan.protocol == "secagg" and (query.squares or query.pre_clip_scale):
        raise ConfigError(f"optimizer={optimizer} needs each user's update at the server (its squares, or "
                          "its scale before clipping); aggregation=secagg reveals only the nodes' sum")


def withheld_rounds(plan: SumPlan, history: Sequence[dict]) -> dict:
    """Under party noise: how many of the rounds done were withheld (fewer noise shares than
    ``min_shares`` survived: nothing released, still charged), the count of the metrics rows marked
    ``withheld``, for summary.json; nothing otherwise. Whether a party survives is assumed
    independent of the data (docs/PRIVACY.md), so the count is as public as those rows."""
    if plan.noise_by != PARTIES:
        return {}
    return {"withheld_rounds": sum(1 for row in history if row.get("withheld"))}


def assign_parties(users: Iterable[int], parties: int) -> list[list[int]]:
    """The one user→party rule: ``users`` dealt to ``parties`` parties by their id, user u to party
    u mod n, each party's users sorted (every party is listed, with none where it holds no user this
    round). A user's party is a function of the user alone, so adding or removing one user moves no
    other user to another party (what the add/remove pair needs when a party drops: docs/PRIVACY.md).
    The in-process parties and the nodes of a Flower run (``server.strategy.assign_users``) use it."""
    if parties < 1:
        raise ValueError(f"need at least one party, got {parties}")
    out: list[list[int]] = [[] for _ in range(parties)]
    for user in sorted(int(u) for u in users):
        out[user % parties].append(user)
    return out
