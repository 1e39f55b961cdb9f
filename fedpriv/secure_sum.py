"""A distributed-DP round in this process: parties encode their users' updates, a secure sum adds
the messages modulo the field, the server decodes what the sum reveals (``backend=local`` with a
``client_noise`` mechanism, :mod:`fedpriv.mechanisms.ddgauss`).

Round t's cohort is dealt to the mechanism's ``shares`` parties by user id (user u to party
u mod n: :func:`assign_parties`); each party trains its users
(:func:`fedpriv.clients.iter_client_updates`: what the ClientApp computes), rounds each update on
the grid under its own secret key (:meth:`fedpriv.distributed_dp.DDGaussCodec.rounded`) and adds
one noise share, holding a user or not (:meth:`~fedpriv.distributed_dp.DDGaussCodec.message`).
The secure sum is simulated as what secure aggregation reveals: the messages' sum mod m, nothing
else; the server receives it decoded (:class:`SecureSum`) and the set of users whose updates it
holds, never one update. No cryptography runs here: the masks of SecAgg/SecAgg+ cancel in the
sum, so the server's view is the same; what a deployment needs beyond that is Flower's SecAgg+.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fedpriv.aggregation import RoundAggregate
from fedpriv.clients import dropped, iter_client_updates
from fedpriv.config import client_diagnostics_enabled
from fedpriv.distributed_dp import DDGaussCodec
from fedpriv.mechanisms.ddgauss import users_bound
from fedpriv.randomness import ClientRandomness
from fedpriv.replies import RoundFn, RoundInputs
from fedpriv.research_key import client_randomness
from fedpriv.schema import RunConfig
from fedpriv.task import Task


def assign_parties(users: list[int], parties: int) -> list[list[int]]:
    """``users`` dealt to ``parties`` parties by their id: user u to party u mod n, each party's
    users sorted (every party is listed, with none where it holds no user this round). A user's
    party is a function of the user alone, so adding or removing one user moves no other user to
    another party (what the add/remove pair needs when a party drops: docs/PRIVACY.md)."""
    if parties < 1:
        raise ValueError(f"need at least one party, got {parties}")
    out: list[list[int]] = [[] for _ in range(parties)]
    for user in sorted(int(u) for u in users):
        out[user % parties].append(user)
    return out


@dataclass
class SecureSum:
    """What secure aggregation revealed of a round: the decoded sum ``total`` of the parties'
    messages (clipped updates + rounding + their noise shares, float32), the ``users`` whose
    updates it holds, the number of noise ``shares`` in it, the users who replied with an update
    that could not be encoded (``rejected``: non-finite; counted, never summed) and the clients'
    training losses (diagnostics only)."""

    total: torch.Tensor
    users: set[int]
    shares: int
    rejected: set[int] = field(default_factory=set)
    losses: list[float] = field(default_factory=list)
    round_idx: int | None = None  # the round it sums (checked when it is added)

    def add_to(self, agg: RoundAggregate, expected: set[int], round_idx: int) -> tuple[set[int], list[float]]:
        if self.round_idx is not None and self.round_idx != round_idx:
            raise ValueError(f"the secure sum of round {self.round_idx + 1} added to round {round_idx + 1}")
        if not (self.users | self.rejected) <= expected:
            raise ValueError("a secure sum holds updates of users outside the round's cohort")
        agg.add_secure_sum(self.total, len(self.users), self.shares)
        agg.rejected += len(self.rejected)
        return self.users | self.rejected, self.losses


@dataclass
class PartyMessage:
    """One party's round: its ``message`` in Z_m (int64), the users whose updates it holds, those
    whose update could not be encoded, and their training losses (diagnostics only)."""

    message: torch.Tensor
    users: set[int]
    rejected: set[int]
    losses: list[float]


def party_message(codec: DDGaussCodec, task: Task, params: torch.Tensor, members: list[int], round_idx: int,
                  round_key: bytes, rng: ClientRandomness, party: int, diagnostics: bool = False) -> PartyMessage:
    """What party ``party`` sends in round ``round_idx``: its ``members``' updates (trained from
    ``params`` with their draws from ``rng``), each rounded on the grid under the party's secret
    key (:meth:`~fedpriv.randomness.ClientRandomness.party_key`), summed, plus its one noise share,
    mod m. The in-process round and a Flower node under ``aggregation=secagg`` both call it."""
    key = rng.party_key(round_idx, party)
    rounded = torch.zeros(codec.mechanism.dim, dtype=torch.int64)
    users: set[int] = set()
    rejected: set[int] = set()
    losses: list[float] = []
    for update in (iter_client_updates(task, params, members, round_idx, rng, diagnostics) if members else ()):
        if "train_loss" in update.metrics:
            losses.append(update.metrics["train_loss"])
        try:
            rounded += codec.rounded(update.delta, round_key, round_idx, key, update.user)
        except FloatingPointError:  # a non-finite update: left out of the party's sum, counted
            rejected.add(update.user)
            continue
        users.add(update.user)
    return PartyMessage(codec.message(rounded, round_idx, key, party), users, rejected, losses)


def distributed_round_fn(task: Task, spec: RunConfig, mechanism, round_key: bytes,
                         dropout_key: bytes | None = None) -> RoundFn:
    """``backend=local``'s round for a ``client_noise`` ``mechanism`` (module docstring): the
    parties' keys and the users' draws are the ClientApp's for ``spec``
    (:func:`~fedpriv.research_key.client_randomness`); ``round_key`` keys the rotation's signs
    (public randomness: privacy does not rest on it). With ``client.dropout_rate`` each party fails
    with that probability (:func:`~fedpriv.clients.dropped`): its users count as dropped and its
    share is missing from the sum, which then holds fewer shares (withheld below ``min_shares``)."""
    rng, diagnostics = client_randomness(spec), client_diagnostics_enabled(spec)
    codec = mechanism.codec()
    length = task.initial_params.numel()

    def round_fn(inputs: RoundInputs) -> SecureSum:
        if not math.isclose(inputs.clip_norm, mechanism.clip_norm):
            raise ValueError(f"the round's clip {inputs.clip_norm} is not the mechanism's {mechanism.clip_norm}")
        r = inputs.round_idx
        total = torch.zeros(codec.mechanism.dim, dtype=torch.int64)
        seen: set[int] = set()
        rejected: set[int] = set()
        losses: list[float] = []
        lost = dropped(dropout_key, r, range(mechanism.shares), spec.client.dropout_rate, "party")
        parties = assign_parties([int(u) for u in inputs.cohort], mechanism.shares)
        for party, members in enumerate(parties):
            if lost[party]:  # its message never reaches the sum: neither its users nor its share
                continue
            sent = party_message(codec, task, inputs.params, members, r, round_key, rng, party, diagnostics)
            seen |= sent.users
            rejected |= sent.rejected
            losses += sent.losses
            total = torch.remainder(total + sent.message, codec.modulus)
        decoded = codec.decode(total, round_key, r, length).to(torch.float32)
        return SecureSum(decoded, seen, int((~lost).sum()), rejected, losses, round_idx=r)

    return round_fn


def field_of(codec: DDGaussCodec) -> tuple[int, float, int]:
    """Distributed DP through Flower's SecAgg+: ``(Q, c, M)`` under which Flower's quantizer is the
    identity on a party's message ``r`` ∈ Z_m sent as ``r − c`` (``Q = m − 1``, ``c = Q/2``:
    ``(x + c)·Q/2c = r`` exactly, an integer that stochastic rounding keeps), summed mod ``M = m``.
    The server (server/secagg.py) and every node (client/app.py) read it from here."""
    m = codec.modulus
    return m - 1, (m - 1) / 2.0, m


# Every node's weight in Flower's SecAgg+ (the setup's ``max_weight`` and each reply's ``num_examples``):
# Flower's weighted mean is then the plain mean. Flower multiplies a node's vector by its weight over
# ``max_weight``, so a weight the server chose could scale a party's message (its noise share) away: the
# server and every node read it from here, and a node refuses a setup with another ``max_weight``.
SECAGG_WEIGHT = 1


@dataclass(frozen=True)
class SecAggQuantization:
    """How ``aggregation=secagg`` (central noise) quantizes a node's sum in Flower's SecAgg+,
    fixed for the whole run from public quantities only — never from a round's cohort, so one
    user joining changes neither the grid nor the clip of anybody else.

    ``coordinate_range`` c: Flower clips each coordinate of a node's sum to ±c (1-Lipschitz: a
    busier node than planned loses accuracy, not privacy); ``levels`` Q = 2^bits − 1 steps of 2c/Q
    with stochastic rounding; ``modulus`` M; ``node_clip`` C′ = C − √d·2c/Q, each user's bound on
    its node, so that one user moves the rounded sum by at most C (coupled rounding moves each
    coordinate by less than one step)."""

    coordinate_range: float
    levels: int
    modulus: int
    node_clip: float

    @property
    def step(self) -> float:
        return 2.0 * self.coordinate_range / self.levels


def secagg_quantization(settings, clip_norm: float, dim: int, expected_cohort: float,
                        nodes: int) -> SecAggQuantization:
    """The run's :class:`SecAggQuantization` for ``settings`` (the ``secagg`` section): c =
    ``secagg.clipping_range``, or C times the users a node holds at most in all but rare rounds
    (:func:`~fedpriv.mechanisms.ddgauss.users_bound` of the expected cohort over the nodes).
    ``ValueError`` when the nodes' sum would overflow the field or the rounding would take more
    than half of C."""
    levels = (1 << int(settings.bits)) - 1
    modulus = 1 << int(settings.modulus_bits)
    if nodes * levels >= modulus:
        raise ValueError(f"{nodes} nodes x 2^{settings.bits} levels overflow the field 2^{settings.modulus_bits}: "
                         "lower secagg.bits or raise secagg.modulus_bits")
    if settings.clipping_range is not None:
        coordinate_range = float(settings.clipping_range)
    else:
        coordinate_range = float(clip_norm) * users_bound(expected_cohort / max(1, nodes))
    reduced = clip_norm - math.sqrt(dim) * 2.0 * coordinate_range / levels
    if not reduced > 0.5 * clip_norm:
        raise ValueError(f"secagg.bits={settings.bits} is too coarse for {dim} coordinates in a range of "
                         f"±{coordinate_range:.3g}: the rounding alone would take {clip_norm - reduced:.3g} of the "
                         f"clip norm {clip_norm:g}; give more bits")
    return SecAggQuantization(coordinate_range, levels, modulus, reduced)


def protocol_sizes(settings, nodes: int, min_shares: int | None = None) -> tuple[int, int]:
    """SecAgg+'s ``(shares, threshold)`` for ``nodes`` nodes and the ``secagg`` section
    ``settings``: ``shares`` (the neighbours a node secret-shares with) defaults to all nodes, made
    odd where fewer; the threshold to ⌊2·shares/3⌋ + 1 (more than half must collude), and — for a
    distributed-noise mechanism — at least its ``min_shares``, so that Flower unmasks no sum that
    holds fewer noise shares than the accounting assumes (the server never sees an under-noised
    sum). ``ValueError`` for a threshold not above half the shares, above them, or equal to them
    when the shares are fewer than the nodes (Flower's own rule), and for distributed noise with
    fewer shares than nodes (every node must hold every other's key shares)."""
    shares = nodes if settings.shares is None else min(int(settings.shares), nodes)
    if shares < nodes and shares % 2 == 0:
        shares += 1
    threshold = shares * 2 // 3 + 1 if settings.threshold is None else int(settings.threshold)
    if min_shares is not None:
        if shares < nodes:
            raise ValueError(f"distributed noise over SecAgg+ shares keys with every node: leave secagg.shares unset "
                             f"(got {settings.shares} of {nodes} nodes)")
        if settings.threshold is not None and threshold < min_shares:
            raise ValueError(f"secagg.threshold={threshold} is below mechanism.min_shares={min_shares}: the server "
                             "would unmask sums with fewer noise shares than the accounting assumes")
        threshold = max(threshold, min_shares)
    if not shares / 2 < threshold <= shares or (shares < nodes and threshold == shares):
        raise ValueError(f"secagg.threshold={threshold} must exceed half of the {shares} shares and not exceed them "
                         "(be fewer, when the shares are fewer than the nodes)")
    return shares, threshold
