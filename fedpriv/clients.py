"""What clients compute in a round, beside the rest of the client code (:mod:`fedpriv.training`:
local steps; :mod:`fedpriv.cohort_parallel`: the same in lockstep): a client's delta from the global
parameters and its own draws. The Flower ClientApp (client/app.py), ``backend=local``'s in-process
round (:func:`in_process_round_fn`) and the benchmarks call these; the server side never does.
"""

from __future__ import annotations

import torch

from fedpriv.aggregation import RoundAggregate
from fedpriv.randomness import ClientRandomness
from fedpriv.replies import ClientUpdate, RoundFn, RoundInputs
from fedpriv.task import Task
from fedpriv.training import local_update


def client_update(task: Task, params: torch.Tensor, user: int, round_idx: int, rng: ClientRandomness,
                  diagnostics: bool = False) -> ClientUpdate:
    """What client ``user`` computes in round ``round_idx`` from the global ``params`` (its
    draws from ``rng``; statistics of its data beside the delta only with ``diagnostics``)."""
    delta, metrics = local_update(task.client_model, params, task.units[user], task.local,
                                  rng.draws(round_idx, user), task.data.vocab.pad_id, bk=task.bk,
                                  diagnostics=diagnostics)
    return ClientUpdate(user=user, delta=delta.cpu(), metrics=metrics)  # the server aggregates in host memory


def client_updates(task: Task, params: torch.Tensor, users: list[int], round_idx: int, rng: ClientRandomness,
                   diagnostics: bool = False) -> list[ClientUpdate]:
    """What the clients ``users`` compute in round ``round_idx``: one after another, or in
    cohort-parallel chunks (``client.parallel > 1``: :mod:`fedpriv.cohort_parallel`), which give
    each user the same delta up to float rounding (the same draws per user)."""
    if task.trainer is None:
        return [client_update(task, params, user, round_idx, rng, diagnostics) for user in users]
    results = task.trainer.updates(params, [task.units[u] for u in users],
                                   [rng.draws(round_idx, u) for u in users], diagnostics)
    return [ClientUpdate(user=u, delta=delta.cpu(), metrics=metrics) for u, (delta, metrics) in zip(users, results)]


class StreamedReplies:
    """A round's replies computed in this process as they are added (pfl-research's round shape:
    train one user → clip into the sum → drop the delta). Users are trained and added in user
    order, the order :class:`~fedpriv.replies.ClientReplies` adds a message's replies in, so the
    sum is bit-identical to the one Flower's message path builds from the same deltas; the round
    holds one delta at a time (with ``client.parallel > 1``, the cohort's deltas: the chunks are
    formed over the whole cohort), never an encoded copy."""

    def __init__(self, task: Task, params: torch.Tensor, users: list[int], round_idx: int,
                 rng: ClientRandomness, diagnostics: bool) -> None:
        self.task, self.params, self.users = task, params, sorted(users)
        self.round_idx, self.rng, self.diagnostics = round_idx, rng, diagnostics

    def _updates(self):
        if self.task.trainer is not None:
            yield from client_updates(self.task, self.params, self.users, self.round_idx, self.rng, self.diagnostics)
            return
        for user in self.users:
            yield client_update(self.task, self.params, user, self.round_idx, self.rng, self.diagnostics)

    def add_to(self, agg: RoundAggregate, expected: set[int], round_idx: int) -> tuple[set[int], list[float]]:
        if round_idx != self.round_idx:
            raise ValueError(f"replies of round {self.round_idx + 1} added to round {round_idx + 1}")
        seen: set[int] = set()
        losses: list[float] = []
        for update in self._updates():
            if update.user not in expected:  # never: the users are the round's cohort
                agg.rejected += 1
                continue
            seen.add(update.user)
            agg.add(update.delta)
            if "train_loss" in update.metrics:
                losses.append(update.metrics["train_loss"])
        return seen, losses


def in_process_round_fn(task: Task, rng: ClientRandomness, diagnostics: bool) -> RoundFn:
    """``backend=local``'s round: the cohort's clients run here and stream into the aggregate
    (:class:`StreamedReplies`); no message, no wire encoding. ``rng`` and ``diagnostics`` are the
    ClientApp's (:func:`fedpriv.randomness.ClientRandomness.for_config`,
    :func:`fedpriv.config.client_diagnostics_enabled`), so the clients compute what they compute
    behind Flower."""

    def round_fn(inputs: RoundInputs) -> StreamedReplies:
        return StreamedReplies(task, inputs.params, [int(u) for u in inputs.cohort], inputs.round_idx, rng,
                               diagnostics)

    return round_fn
