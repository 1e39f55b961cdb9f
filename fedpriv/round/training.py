"""A client's local update: E epochs of minibatch SGD from the global model, returned as a delta.

Determinism: the client's draws come from :class:`fedpriv.keys.randomness.ClientRandomness` —
derived from ``(research key, round, user)`` in research mode, so every backend and a resumed
run reproduce the same client update; fresh OS entropy in secure mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedpriv.clipping import BookKeeping
from fedpriv.clipping.engine import REPLAY_EVERY
from fedpriv.data.federated import rows_tensor
from fedpriv.round.local_dp import ExampleDP, dp_sgd_steps
from fedpriv.metrics import token_loss
from fedpriv.models import get_flat_params, set_flat_params
from fedpriv.precision import compute_precision
from fedpriv.keys.randomness import ClientDraws


@dataclass(frozen=True)
class LocalConfig:
    """Local optimisation settings of every client."""

    epochs: int = 1
    batch_size: int = 16
    lr: float = 0.5
    max_steps: int | None = None  # cap on local steps per round (None: full epochs)
    dp: ExampleDP | None = None  # example-level DP-SGD steps instead of plain SGD (client.dp=example)
    replay_every: int = REPLAY_EVERY  # every Book-Keeping engine's forward-replay schedule (client.bk_replay_every)
    precision: str = "fp32"  # the arithmetic of the local steps (client.precision: fedpriv/precision.py)


def local_update(model: nn.Module, global_params: torch.Tensor, rows: np.ndarray, cfg: LocalConfig,
                 draws: ClientDraws, pad_id: int = 0, bk: BookKeeping | None = None,
                 diagnostics: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    """Run local SGD on ``rows`` starting from ``global_params``; return (delta, metrics).

    ``delta = θ_local − θ_global`` as a flat float32 vector. ``metrics`` is empty unless
    ``diagnostics`` (research mode, user-level DP only): then the mean training loss and the
    numbers of sentences and steps — statistics of the user's data that no epsilon covers. With
    ``cfg.dp`` the steps are example-level DP-SGD (:mod:`fedpriv.round.local_dp`) through ``bk``, a
    BookKeeping engine hooked on ``model``, and nothing but the delta is returned. ``draws``: the
    client's randomness this round (the minibatch order; the DP masks and noise). The steps run
    in ``cfg.precision`` (:func:`fedpriv.precision.compute_precision`); the delta is float32.
    """
    global_params = global_params.to(_device_of(model))
    set_flat_params(model, global_params)
    model.train()
    if cfg.dp is not None:
        if bk is None:
            raise ValueError("client.dp=example needs a BookKeeping engine on the client model")
        with compute_precision(cfg.precision, global_params.device):
            dp_sgd_steps(model, bk, rows, cfg.lr, cfg.dp, draws, pad_id)
        return get_flat_params(model).sub_(global_params), {}
    losses: list[torch.Tensor] | None = [] if diagnostics else None
    with compute_precision(cfg.precision, global_params.device):
        steps = _sgd_steps(model, rows, cfg, draws.order, pad_id, losses)
    delta = get_flat_params(model).sub_(global_params)  # in the fresh copy: no second model-sized tensor
    if losses is None:
        return delta, {}
    return delta, {"train_loss": float(torch.stack(losses).mean()) if losses else 0.0,
                   "num_sentences": float(len(rows)), "num_steps": float(steps)}


def batch_schedule(num_rows: int, cfg: LocalConfig, generator: torch.Generator) -> list[torch.Tensor]:
    """The row indices of every local step of plain minibatch SGD: ``cfg.epochs`` passes, each in
    a fresh ``randperm`` order from ``generator``, cut into batches of ``cfg.batch_size`` (the
    last one smaller), at most ``cfg.max_steps`` steps in all. The per-client loop and the
    cohort-parallel trainer (:mod:`fedpriv.round.cohort_parallel`) both take their steps from here."""
    steps: list[torch.Tensor] = []
    for _ in range(cfg.epochs):
        order = torch.randperm(num_rows, generator=generator)
        for start in range(0, num_rows, cfg.batch_size):
            if cfg.max_steps is not None and len(steps) >= cfg.max_steps:
                break
            steps.append(order[start:start + cfg.batch_size])
    return steps


def _sgd_steps(model: nn.Module, rows: np.ndarray, cfg: LocalConfig, generator: torch.Generator,
               pad_id: int, losses: list[torch.Tensor] | None = None) -> int:
    """Plain minibatch SGD on ``model`` in place over :func:`batch_schedule`'s steps; returns the
    number of steps (batch losses appended to ``losses`` if given)."""
    data = rows_tensor(rows, _device_of(model))
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    schedule = batch_schedule(len(data), cfg, generator)
    for batch_rows in schedule:
        batch = data[batch_rows.to(data.device)]
        opt.zero_grad(set_to_none=True)
        loss = token_loss(model, batch, pad_id)
        loss.backward()
        opt.step()
        if losses is not None:
            losses.append(loss.detach())
    return len(schedule)


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device
