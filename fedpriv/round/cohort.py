"""One-pass clipped sums: the clipped one-step deltas of many units (users or examples) from one
batched Book-Keeping backward per chunk, instead of one forward/backward per unit.

A unit u owns rows R_u. Its loss is the mean next-token cross-entropy over the non-pad targets of
its rows, ``L_u(θ) = Σ_{i∈R_u} Σ_t CE_{i,t} / n_u``, and its delta is one SGD step
``Δ_u = −η ∇L_u(θ)``: what a DP-FedSGD client taking one full-batch local step sends, or one
example's update in DP-SGD. Since ``‖Δ_u‖ = η‖∇L_u‖``, clipping Δ_u to C is clipping ∇L_u to C/η::

    Σ_u min(1, C/‖Δ_u‖) Δ_u  =  −η · Σ_u min(1, (C/η)/‖∇L_u‖) ∇L_u

and the right side is BK's grouped clipped sum (``groups`` = unit of each row, clip norm C/η,
no noise: the server mechanism adds it once to the round's sum). Chunks hold whole units, so a
unit's gradient is never split across backwards.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedpriv.clipping import BookKeeping
from fedpriv.clipping.engine import REPLAY_EVERY
from fedpriv.metrics import sequence_token_losses
from fedpriv.models import set_flat_params
from fedpriv.precision import compute_precision


@dataclass
class CohortSum:
    """The clipped sum of a cohort's deltas, computed in one pass (no per-unit deltas exist).

    ``norms[k]`` is unit ``users[k]``'s delta norm before clipping (0 for a unit with no rows, whose
    delta is 0); ``train_loss`` is the mean of the losses L_u at the round's parameters of the
    units that have rows.
    """

    users: np.ndarray
    total: torch.Tensor
    norms: torch.Tensor
    train_loss: float

    def add_to(self, agg, expected: set[int], round_idx: int) -> tuple[set[int], list[float]]:
        """Add this sum to the round's aggregate; it must cover exactly the cohort."""
        if sorted(int(u) for u in self.users) != sorted(expected):
            raise ValueError(f"round {round_idx}: the one-pass sum does not cover exactly the cohort")
        agg.add_clipped_sum(self.total, self.norms)
        return set(expected), [self.train_loss]


def pack_chunks(sizes: Sequence[int], max_rows: int) -> list[list[int]]:
    """Consecutive runs of unit indices whose row counts add up to at most ``max_rows``
    (a unit larger than ``max_rows`` forms a chunk alone)."""
    chunks: list[list[int]] = []
    current: list[int] = []
    rows = 0
    for k, size in enumerate(sizes):
        if current and rows + size > max_rows:
            chunks.append(current)
            current, rows = [], 0
        current.append(k)
        rows += size
    if current:
        chunks.append(current)
    return chunks


class CohortClipper:
    """Clipped sums of one-step unit deltas for ``model`` (a replica this object hooks for good).

    ``clipped_sum(params, users, rows_of)`` returns ``Σ_u min(1, C/‖Δ_u‖) Δ_u`` with
    ``Δ_u = −lr ∇L_u(params)`` for every ``u`` in ``users`` (rows ``rows_of(u)``), flat in
    ``get_flat_params`` order. ``mode`` is BK's per-layer norm method.
    """

    def __init__(self, model: nn.Module, clip_norm: float, lr: float, pad_id: int,
                 mode: str = "mixopt", max_rows: int = 512, replay_every: int = REPLAY_EVERY,
                 precision: str = "fp32") -> None:
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr}")
        self.model = model
        self.clip_norm = float(clip_norm)
        self.lr = float(lr)
        self.pad_id = pad_id
        self.max_rows = int(max_rows)
        self.precision = precision  # the forward/backward's arithmetic (BK's norms and sums: IEEE float32)
        self.bk = BookKeeping(model, clip_norm=self.clip_norm / self.lr, noise_multiplier=0.0, mode=mode,
                              replay_every=replay_every)
        self._params = [p for p in model.parameters() if p.requires_grad]
        # the output layer on non-pad targets only (flattened positions), where the model offers it
        # and no weight is shared between layers (BK needs one layout per parameter)
        self.flat = ("keep" in inspect.signature(model.forward).parameters
                     and len(list(model.named_parameters(remove_duplicate=False))) == len(list(model.parameters())))

    def set_clip_norm(self, clip_norm: float) -> None:
        """Clip the next sums to ``clip_norm`` (adaptive clipping's C_t)."""
        self.clip_norm = float(clip_norm)
        self.bk.clip_norm = self.clip_norm / self.lr

    def clipped_sum(self, params: torch.Tensor, users: np.ndarray, rows_of) -> CohortSum:
        device = self._params[0].device
        with compute_precision(self.precision, device):
            return self._clipped_sum(params, users, rows_of, device)

    def _clipped_sum(self, params: torch.Tensor, users: np.ndarray, rows_of, device: torch.device) -> CohortSum:
        set_flat_params(self.model, params)
        self.model.train()
        total = torch.zeros(params.numel(), dtype=params.dtype, device=device)
        all_norms = torch.zeros(len(users), device=device)
        losses: list[torch.Tensor] = []
        rows = [np.asarray(rows_of(int(u))) for u in users]
        # a unit with no rows has no loss: its delta is 0 (what the per-client loop computes: no
        # step), norm 0, and it takes no place in a chunk (BK numbers the groups present, so an
        # empty one would shift its neighbours' norms)
        # similar units side by side: equal-size units form contiguous BK buckets, and chunks of
        # short sentences drop their all-pad columns (the clipped sum does not depend on order)
        order = sorted((k for k in range(len(rows)) if len(rows[k])),
                       key=lambda k: (len(rows[k]), int((rows[k] != self.pad_id).sum())))
        for chunk in pack_chunks([len(rows[k]) for k in order], self.max_rows):
            chunk = [order[k] for k in chunk]
            data = torch.as_tensor(np.concatenate([rows[k] for k in chunk]), dtype=torch.long, device=device)
            groups = torch.repeat_interleave(torch.arange(len(chunk), device=device),
                                             torch.tensor([len(rows[k]) for k in chunk], device=device))
            ce, count = sequence_token_losses(self.model, data, self.pad_id, flat=self.flat)
            tokens = torch.zeros(len(chunk), dtype=ce.dtype, device=device).index_add_(0, groups, count.to(ce.dtype))
            per_row = ce / tokens.clamp(min=1.0)[groups]  # row i's share of its unit's mean loss
            self.bk.backward(per_row, groups=groups)
            offset = 0
            for p in self._params:
                n = p.numel()
                total[offset:offset + n].add_(p.grad.reshape(-1), alpha=-self.lr)
                offset += n
            all_norms[torch.tensor(chunk, device=device)] = self.bk.last_norms * self.lr
            losses.append(torch.zeros(len(chunk), device=device).index_add_(0, groups, per_row.detach()))
        if not torch.isfinite(all_norms).all() or not torch.isfinite(total).all():
            # no user ids in the message: they would say who was sampled
            raise FloatingPointError("a sampled unit has a non-finite gradient in the one-pass round: "
                                     "lower client.lr or check the data")
        # the server's aggregate lives in host memory
        return CohortSum(users=np.asarray(users), total=total.cpu(), norms=all_norms.cpu(),
                         train_loss=float(torch.cat(losses).mean()) if losses else float("nan"))
