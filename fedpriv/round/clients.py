"""What clients compute in a round, beside the rest of the client code (:mod:`fedpriv.round.training`:
local steps; :mod:`fedpriv.round.cohort_parallel`: the same in lockstep): a client's delta from the global
parameters and its own draws. The Flower ClientApp (client/app.py), ``backend=local``'s in-process
round (:func:`in_process_round_fn`) and the benchmarks call these; the server side never does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from fedpriv.round.aggregation import RoundAggregate
from fedpriv.config.resolve import client_diagnostics_enabled
from fedpriv.precision import exact_fp32
from fedpriv.keys.randomness import ClientRandomness, uniforms
from fedpriv.keys.research_key import client_randomness
from fedpriv.round.replies import ClientUpdate, RoundFn, RoundInputs, add_updates
from fedpriv.schema import RunConfig
from fedpriv.task import Task
from fedpriv.round.training import local_update


def client_update(task: Task, params: torch.Tensor, user: int, round_idx: int, rng: ClientRandomness,
                  diagnostics: bool = False) -> ClientUpdate:
    """What client ``user`` computes in round ``round_idx`` from the global ``params`` (its
    draws from ``rng``; statistics of its data beside the delta only with ``diagnostics``)."""
    delta, metrics = local_update(task.client_model, params, task.units[user], task.local,
                                  rng.draws(round_idx, user), task.data.vocab.pad_id, bk=task.bk,
                                  diagnostics=diagnostics)
    return ClientUpdate(user=user, delta=delta.cpu(), metrics=metrics)  # the server aggregates in host memory


def iter_client_updates(task: Task, params: torch.Tensor, users: list[int], round_idx: int,
                        rng: ClientRandomness, diagnostics: bool = False, host: bool = True) -> Iterator[ClientUpdate]:
    """What the clients ``users`` compute in round ``round_idx``, in their order: one after another,
    each computed when it is asked for, or in cohort-parallel chunks (``client.parallel > 1``:
    :mod:`fedpriv.round.cohort_parallel`; all of them at once), which give each user the same delta up to
    float rounding (the same draws per user). Deltas come in host memory, or with ``host=False``
    (cohort-parallel chunks only) on the device that computed them."""
    if task.trainer is None:
        for user in users:
            yield client_update(task, params, user, round_idx, rng, diagnostics)
        return
    results = task.trainer.updates(params, [task.units[u] for u in users],
                                   [rng.draws(round_idx, u) for u in users], diagnostics)
    for u, (delta, metrics) in zip(users, results):
        yield ClientUpdate(user=u, delta=delta.cpu() if host else delta, metrics=metrics)


def client_updates(task: Task, params: torch.Tensor, users: list[int], round_idx: int, rng: ClientRandomness,
                   diagnostics: bool = False) -> list[ClientUpdate]:
    """:func:`iter_client_updates`, all of them (a node's reply carries them together)."""
    return list(iter_client_updates(task, params, users, round_idx, rng, diagnostics))


class StreamedReplies:
    """A round's replies computed in this process as they are added (pfl-research's round shape:
    train one user → clip into the sum → drop the delta). Users are trained and added in user
    order, the order :class:`~fedpriv.round.replies.ClientReplies` adds a message's replies in, so the
    sum is bit-identical to the one Flower's message path builds from the same deltas; the round
    holds one delta at a time (with ``client.parallel > 1``, the cohort's deltas: the chunks are
    formed over the whole cohort), never an encoded copy. Cohort-parallel deltas are clipped and
    summed on the device that computed them, in user order, and the sum is copied to host memory
    once (:meth:`~fedpriv.round.aggregation.RoundAggregate.beside`): bit-identical on the CPU, equal up to
    the device's float rounding of norms and sums on a GPU."""

    def __init__(self, task: Task, params: torch.Tensor, users: list[int], round_idx: int,
                 rng: ClientRandomness, diagnostics: bool) -> None:
        self.task, self.params, self.users = task, params, sorted(users)
        self.round_idx, self.rng, self.diagnostics = round_idx, rng, diagnostics

    def add_to(self, agg: RoundAggregate, expected: set[int], round_idx: int) -> tuple[set[int], list[float]]:
        if round_idx != self.round_idx:
            raise ValueError(f"replies of round {self.round_idx + 1} added to round {round_idx + 1}")
        losses: list[float] = []

        near = agg.beside(self.task.device) if self.task.trainer is not None else None

        def noting_losses() -> Iterator[ClientUpdate]:
            for update in iter_client_updates(self.task, self.params, self.users, self.round_idx, self.rng,
                                              self.diagnostics, host=near is None):
                if "train_loss" in update.metrics:
                    losses.append(update.metrics["train_loss"])
                yield update

        if near is None:
            return add_updates(agg, expected, noting_losses()), losses
        with exact_fp32():  # the clip and sum on the device: IEEE float32 whatever client.precision
            seen = add_updates(near, expected, noting_losses())
        agg.merge(near)
        return seen, losses


def dropped(key: bytes | None, round_idx: int, ids: Iterable[int], rate: float, kind: str = "user") -> np.ndarray:
    """Which of the participants ``ids`` (users, or secure-aggregation parties: ``kind``) fail to
    reply in round ``round_idx``: each independently with probability ``rate``
    (``client.dropout_rate``), from its own uniform under ``key`` (the run's, secret in secure
    mode) indexed by (round, id) — never from the data, and one participant's draw never depends
    on who else takes part. None of them without a rate."""
    ids = [int(i) for i in ids]
    if not rate:
        return np.zeros(len(ids), dtype=bool)
    if key is None:
        raise ValueError("a dropout rate needs the run's dropout key")
    return np.array([uniforms(key, f"{kind} dropout", (round_idx, i), 1)[0] < rate for i in ids], dtype=bool)


def in_process_round_fn(task: Task, spec: RunConfig, dropout_key: bytes | None = None) -> RoundFn:
    """``backend=local``'s round for the run's resolved typed config ``spec``: the cohort's clients
    run here and stream into the aggregate (:class:`StreamedReplies`); no message, no wire encoding.
    Their randomness and diagnostics are the ClientApp's for ``spec``
    (:func:`~fedpriv.keys.research_key.client_randomness`,
    :func:`fedpriv.config.resolve.client_diagnostics_enabled`), so they compute what they compute behind
    Flower. With ``client.dropout_rate``, each sampled user fails to reply with that probability
    (:func:`dropped`, keyed by ``dropout_key``): it counts as dropped, the denominator stays fixed."""
    rng, diagnostics = client_randomness(spec), client_diagnostics_enabled(spec)

    rate = spec.client.dropout_rate

    def round_fn(inputs: RoundInputs) -> StreamedReplies:
        users = [int(u) for u in inputs.cohort]
        lost = dropped(dropout_key, inputs.round_idx, users, rate)
        return StreamedReplies(task, inputs.params, [u for u, gone in zip(users, lost) if not gone],
                               inputs.round_idx, rng, diagnostics)

    return round_fn
