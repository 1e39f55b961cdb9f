"""A client's local update: E epochs of minibatch SGD from the global model, returned as a delta.

Determinism: the minibatch order depends only on ``(seed, round, user)``, so every backend and a
resumed run reproduce the same client update.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedpriv.clipping import BookKeeping
from fedpriv.local_dp import ExampleDP, dp_sgd_steps
from fedpriv.metrics import token_loss
from fedpriv.models import get_flat_params, set_flat_params


@dataclass(frozen=True)
class LocalConfig:
    """Local optimisation settings of every client."""

    epochs: int = 1
    batch_size: int = 16
    lr: float = 0.5
    max_steps: int | None = None  # cap on local steps per round (None: full epochs)
    dp: ExampleDP | None = None  # example-level DP-SGD steps instead of plain SGD (client.dp=example)


def client_generator(seed: int, round_idx: int, user: int) -> torch.Generator:
    """The generator that orders one client's minibatches in one round."""
    seq = np.random.SeedSequence([seed, 7, round_idx, user])
    return torch.Generator().manual_seed(int(seq.generate_state(1, dtype=np.uint64)[0] >> 1))


def local_update(model: nn.Module, global_params: torch.Tensor, rows: np.ndarray, cfg: LocalConfig,
                 generator: torch.Generator, pad_id: int = 0,
                 bk: BookKeeping | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Run local SGD on ``rows`` starting from ``global_params``; return (delta, metrics).

    ``delta = θ_local − θ_global`` as a flat float32 vector; metrics hold the mean training loss
    and the number of sentences and steps. With ``cfg.dp`` the steps are example-level DP-SGD
    (:mod:`fedpriv.local_dp`) through ``bk``, a BookKeeping engine hooked on ``model``.
    """
    set_flat_params(model, global_params)
    model.train()
    if cfg.dp is not None:
        if bk is None:
            raise ValueError("client.dp=example needs a BookKeeping engine on the client model")
        losses, steps = dp_sgd_steps(model, bk, rows, cfg.lr, cfg.dp, generator, pad_id)
    else:
        losses, steps = _sgd_steps(model, rows, cfg, generator, pad_id)
    delta = get_flat_params(model) - global_params
    return delta, {"train_loss": float(np.mean(losses)) if losses else 0.0,
                   "num_sentences": float(len(rows)), "num_steps": float(steps)}


def _sgd_steps(model: nn.Module, rows: np.ndarray, cfg: LocalConfig, generator: torch.Generator,
               pad_id: int) -> tuple[list[float], int]:
    """Plain minibatch SGD on ``model`` in place: ``cfg.epochs`` shuffled passes, at most
    ``cfg.max_steps`` steps; returns (batch losses, steps)."""
    data = torch.as_tensor(rows, dtype=torch.long)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    losses: list[float] = []
    steps = 0
    for _ in range(cfg.epochs):
        order = torch.randperm(len(data), generator=generator)
        for start in range(0, len(data), cfg.batch_size):
            if cfg.max_steps is not None and steps >= cfg.max_steps:
                break
            batch = data[order[start:start + cfg.batch_size]]
            opt.zero_grad(set_to_none=True)
            loss = token_loss(model, batch, pad_id)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            steps += 1
    return losses, steps

