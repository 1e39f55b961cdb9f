"""Cohort-parallel local training: the sampled clients' local steps run in lockstep as one
vectorized computation (``client.parallel`` clients per chunk; 1 keeps the per-client loop).

Every client of a chunk has its own copy of the parameters, stacked on a leading client axis
``θ[c]``. Step k is one ``torch.func.vmap`` over that axis of the gradient of the client's loss,
then ``θ[c] ← θ[c] − η g[c]`` — the per-client loop's step, computed for all clients at once
(the model ensembling pattern of ``torch.func``). Clients are ragged: they take different
numbers of steps on batches of different sizes. Each client's steps come from the same schedule
the loop draws (:func:`fedpriv.round.training.batch_schedule`, :func:`fedpriv.round.local_dp.example_schedule`,
from the same per-client draws), batches are padded to the chunk's widest with all-pad rows,
and a client past its last step gets an all-pad batch. A pad row adds nothing to a loss, so:

* plain SGD: client c's step-k loss is ``Σ CE / n_ck`` over its real batch's non-pad targets
  (``n_ck`` its count; 1 for a client with no step k, whose loss and gradient are then exactly 0);
* example-level DP-SGD (``client.dp=example``, :mod:`fedpriv.round.local_dp`): per-example gradients
  (a second ``vmap``, over rows), each clipped to ``C_e`` (``g · C_e / max(‖g‖, C_e)``; a pad row's
  gradient is 0), summed, plus ``σ_e C_e N(0, I)`` drawn from the client's own noise stream over
  its parameters in the loop's order, divided by the fixed ``D``.

Each client's delta therefore equals the loop's up to float rounding (tests/test_cohort_parallel.py
pins it for the LSTM and the transformer, with and without example-level DP). The LSTM runs its
unrolled forward here (the fused kernel has no batching rule: :func:`fedpriv.models.vmappable`).
Memory grows with the chunk: logits ``[chunk, batch, T, V]`` per step, and with example-level DP
the per-example gradients ``[chunk, rows, #params]``; ``client.parallel`` bounds both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, grad_and_value, vmap

from fedpriv.round.local_dp import ExampleDP, example_schedule
from fedpriv.keys.randomness import ClientDraws
from fedpriv.models import set_flat_params, vmappable
from fedpriv.precision import as_fp32, compute_precision, exact_fp32
from fedpriv.round.training import LocalConfig, batch_schedule


@dataclass
class _Chunk:
    """The rows of a chunk's clients in one tensor, with a trailing all-pad row: ``pool[index]``
    gathers a ``[clients, batch, L]`` step (index ``len(pool) − 1`` is the pad row)."""

    pool: Tensor
    offsets: list[int]

    @classmethod
    def of(cls, rows: Sequence[np.ndarray], pad_id: int, device: torch.device) -> _Chunk:
        width = np.asarray(rows[0]).shape[1]
        offsets = np.cumsum([0] + [len(r) for r in rows]).tolist()
        pool = np.concatenate([np.asarray(r) for r in rows] + [np.full((1, width), pad_id)])
        return cls(torch.as_tensor(pool, dtype=torch.long, device=device), offsets)

    @property
    def pad(self) -> int:
        return len(self.pool) - 1

    def batch(self, picks: Sequence[Tensor | None]) -> Tensor:
        """Client c's rows ``picks[c]`` (indices into its own rows; None: no step), padded."""
        width = max([len(p) for p in picks if p is not None] + [1])
        index = torch.full((len(picks), width), self.pad, dtype=torch.long)
        for c, pick in enumerate(picks):
            if pick is not None:
                index[c, :len(pick)] = pick + self.offsets[c]
        return self.pool[index.to(self.pool.device)]


class CohortTrainer:
    """Local updates of many clients from one global model, ``parallel`` clients per chunk.

    ``updates(params, rows, draws)`` returns, for every client, the delta the per-client
    loop (:func:`fedpriv.round.training.local_update`) computes with the same draws, and, with
    ``diagnostics``, the loop's metrics (mean batch loss, sentences, steps; user-level DP only).
    """

    def __init__(self, model: nn.Module, local: LocalConfig, pad_id: int, parallel: int) -> None:
        if parallel < 1:
            raise ValueError(f"parallel must be at least 1, got {parallel}")
        self.model = vmappable(model)
        self.model.train()
        self.local = local
        self.pad_id = pad_id
        self.parallel = int(parallel)
        self.names = [name for name, p in self.model.named_parameters() if p.requires_grad]
        self._step = vmap(grad_and_value(self._batch_loss))
        self._example_grads = vmap(vmap(grad(self._example_loss), in_dims=(None, 0)))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # --- losses of one client (vmapped over the client axis) -------------------------------------

    def _summed_ce(self, params: dict[str, Tensor], rows: Tensor) -> tuple[Tensor, Tensor]:
        """The summed next-token CE over the non-pad targets of ``rows`` [B, L], and their count
        (the fixed-shape form of :func:`fedpriv.metrics.sequence_token_losses`, which vmap needs)."""
        y = rows[:, 1:]
        logits = functional_call(self.model, params, (rows[:, :-1],))
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=self.pad_id,
                             reduction="sum")
        return ce, (y != self.pad_id).sum().to(ce.dtype)

    def _batch_loss(self, params: dict[str, Tensor], rows: Tensor, active: Tensor) -> Tensor:
        """Mean next-token CE over the non-pad targets of ``rows`` [B, L] (0 for an inactive client)."""
        ce, count = self._summed_ce(params, rows)
        return ce / torch.where(active, count, torch.ones_like(count))

    def _example_loss(self, params: dict[str, Tensor], row: Tensor) -> Tensor:
        """Row ``row`` [L]'s mean token CE (0 for a pad row): the loss DP-SGD clips the gradient of."""
        ce, count = self._summed_ce(params, row.unsqueeze(0))
        return ce / count.clamp(min=1)

    # --- the chunks -------------------------------------------------------------------------------

    def updates(self, params: Tensor, rows: Sequence[np.ndarray], draws: Sequence[ClientDraws],
                diagnostics: bool = False) -> list[tuple[Tensor, dict[str, float]]]:
        """``(delta, metrics)`` of every client (flat, in ``get_flat_params`` order)."""
        if len(rows) != len(draws):
            raise ValueError("one ClientDraws per client is needed")
        params = params.to(self.device)
        with compute_precision(self.local.precision, self.device):
            return self._updates(params, rows, draws, diagnostics)

    def _updates(self, params: Tensor, rows: Sequence[np.ndarray], draws: Sequence[ClientDraws],
                 diagnostics: bool) -> list[tuple[Tensor, dict[str, float]]]:
        # clients of similar size side by side (a client's step count grows with its rows), so a
        # chunk's short clients do not idle through its long ones' steps; each client's result
        # does not depend on its chunk
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        out: list[tuple[Tensor, dict[str, float]] | None] = [None] * len(rows)
        for start in range(0, len(rows), self.parallel):
            chunk = order[start:start + self.parallel]
            results = self._chunk(params, [rows[i] for i in chunk], [draws[i] for i in chunk], diagnostics)
            for i, result in zip(chunk, results):
                out[i] = result
        return out  # type: ignore[return-value]

    def _stacked(self, params: Tensor, clients: int) -> dict[str, Tensor]:
        """Every client's copy of the flat ``params``, stacked on a leading client axis."""
        set_flat_params(self.model, params)  # the replica's own parameters are never trained
        return {name: p.detach().expand(clients, *p.shape).clone()
                for name, p in self.model.named_parameters() if p.requires_grad}

    def _chunk(self, params: Tensor, rows: Sequence[np.ndarray], draws: Sequence[ClientDraws],
               diagnostics: bool) -> list[tuple[Tensor, dict[str, float]]]:
        theta = self._stacked(params, len(rows))
        chunk = _Chunk.of(rows, self.pad_id, self.device)
        if self.local.dp is not None:
            self._dp_steps(theta, chunk, rows, draws, self.local.dp)
            metrics = [{} for _ in rows]
        else:
            metrics = self._sgd_steps(theta, chunk, rows, draws, diagnostics)
        deltas = torch.cat([theta[name].reshape(len(rows), -1) for name in self.names], dim=1) - params
        return list(zip(deltas.unbind(0), metrics))

    def _sgd_steps(self, theta: dict[str, Tensor], chunk: _Chunk, rows: Sequence[np.ndarray],
                   draws: Sequence[ClientDraws], diagnostics: bool) -> list[dict[str, float]]:
        schedules = [batch_schedule(len(r), self.local, d.order) for r, d in zip(rows, draws)]
        losses: list[list[Tensor]] = [[] for _ in rows]
        for k in range(max(len(s) for s in schedules)):
            picks = [s[k] if k < len(s) else None for s in schedules]
            active = torch.tensor([p is not None for p in picks], device=self.device)
            grads, loss = self._step(theta, chunk.batch(picks), active)
            for name in self.names:
                theta[name].add_(grads[name], alpha=-self.local.lr)
            if diagnostics:
                for c in range(len(rows)):
                    if picks[c] is not None:
                        losses[c].append(loss[c])
        if not diagnostics:
            return [{} for _ in rows]
        return [{"train_loss": float(torch.stack(ls).mean()) if ls else 0.0, "num_sentences": float(len(r)),
                 "num_steps": float(len(s))} for ls, r, s in zip(losses, rows, schedules)]

    def _dp_steps(self, theta: dict[str, Tensor], chunk: _Chunk, rows: Sequence[np.ndarray],
                  draws: Sequence[ClientDraws], dp: ExampleDP) -> None:
        drawn = [example_schedule(len(r), dp, d) for r, d in zip(rows, draws)]
        std = dp.noise_multiplier * dp.clip_norm
        for k in range(dp.steps):
            picks = [torch.nonzero(masks[k]).flatten() for _, masks in drawn]
            grads = self._example_grads(theta, chunk.batch(picks))  # [clients, rows, *shape]
            with exact_fp32():  # norms, clip factors and clipped sums in IEEE float32 (any precision)
                grads = {name: as_fp32(g) for name, g in grads.items()}
                sq = sum(g.pow(2).flatten(2).sum(-1) for g in grads.values())
                scale = dp.clip_norm / sq.sqrt().clamp_min(dp.clip_norm)  # [clients, rows]
                summed = {name: torch.einsum("cb,cb...->c...", scale, grads[name]).contiguous()
                          for name in self.names}
            del grads
            for c, (noise, _) in enumerate(drawn):  # each client's own stream, over its parameters in order
                noise.add_([summed[name][c] for name in self.names], std)
            for name in self.names:
                theta[name].add_(summed[name], alpha=-self.local.lr / dp.denominator)
