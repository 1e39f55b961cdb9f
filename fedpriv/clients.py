"""What clients compute in a round, beside the rest of the client code (:mod:`fedpriv.training`:
local steps; :mod:`fedpriv.cohort_parallel`: the same in lockstep): a client's delta from the global
parameters and its own draws. The Flower ClientApp (client/app.py) and the in-process tools call
these; the server side never does.
"""

from __future__ import annotations

import torch

from fedpriv.randomness import ClientRandomness
from fedpriv.replies import ClientUpdate
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
