"""Example-level DP on clients (``client.dp=example``): every local step is DP-SGD through BK.

Step k of client u in a round: each row joins the batch B_k independently with probability q;
with ``ℓ_i`` the mean token loss of row i and ``g_i = ∇ℓ_i``::

    θ ← θ − η · ( Σ_{i∈B_k} min(1, C_e/‖g_i‖) g_i + σ_e C_e N(0, I) ) / D

``D = client.example.denominator`` is a fixed, public constant (think q times a typical row
count): dividing by the client's own q·n_u would make the step depend on its private row count.
An empty batch still takes the noise-only step (the accountant counts every step).

Accounting (per example, add/remove-one of one example in one client's data): a round where the
client takes part releases ``K`` steps of ``PoissonSampledDpEvent(q, GaussianDpEvent(σ_e))``.
fedpriv assumes the worst case that the client takes part in *every* round (no amplification
from user sampling is claimed), so after R rounds the example-level event is
``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(σ_e)), R·K)``. The guarantee is
against the server too: a client's reply carries the privatized delta and nothing else (no loss,
no counts), and its masks and noise are read from its own 256-bit round key (OS entropy in secure
mode, never stored or sent; see :class:`fedpriv.keys.randomness.ClientDraws`). The server's user-level
clipping and noise are a separate guarantee on top.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dp_accounting
import numpy as np
import torch
from torch import nn

from fedpriv import schema
from fedpriv.accounting import calibrate_noise_multiplier, compute_epsilon
from fedpriv.clipping import BookKeeping, GaussianKeystream
from fedpriv.data.federated import rows_tensor
from fedpriv.metrics import sequence_token_losses
from fedpriv.keys.randomness import ClientDraws


@dataclass(frozen=True)
class ExampleDP:
    """Resolved example-level DP-SGD settings of every client."""

    sampling_rate: float
    steps: int
    clip_norm: float
    noise_multiplier: float
    delta: float
    denominator: float = 1.0  # D: the fixed, public divisor of a step's noisy clipped sum
    mode: str = "mixopt"

    def event(self, rounds: int) -> dp_accounting.DpEvent:
        """The example-level event after ``rounds`` rounds (client assumed in every round)."""
        return example_event(self.sampling_rate, self.noise_multiplier, rounds * self.steps)

    def epsilon(self, rounds: int, accountant: str = "rdp") -> float:
        if self.noise_multiplier == 0:
            return float("inf")
        return compute_epsilon(self.event(rounds), self.delta, accountant)


def example_event(rate: float, noise_multiplier: float, steps: int) -> dp_accounting.DpEvent:
    """``steps`` × Poisson-sampled Gaussian: example-level DP-SGD."""
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(noise_multiplier)), steps)


def resolve_example_dp(client: schema.Client | Mapping[str, Any], rounds: int,
                       accountant: str = "rdp") -> ExampleDP | None:
    """``client.example`` as an :class:`ExampleDP` (σ_e calibrated when not given); None when
    ``client.dp`` is ``none``. ``client``: the typed section (a mapping is checked by the schema
    first). Raises ``ConfigError`` for bad values."""
    spec = client if isinstance(client, schema.Client) else schema.load(schema.Client, client, "client")
    if spec.dp == "none":
        return None
    ex = spec.example
    rate, steps, clip, delta = ex.sampling_rate, ex.steps, ex.clip_norm, ex.delta
    mode, denominator, sigma = ex.mode, ex.denominator, ex.noise_multiplier
    if sigma is None:
        sigma = calibrate_noise_multiplier(lambda s: example_event(rate, s, rounds * steps), float(ex.target_epsilon),
                                           float(delta), accountant)
    return ExampleDP(sampling_rate=float(rate), steps=steps, clip_norm=float(clip), noise_multiplier=float(sigma),
                     delta=float(delta), denominator=float(denominator), mode=mode)


def example_schedule(num_rows: int, dp: ExampleDP, draws: ClientDraws) -> tuple[GaussianKeystream, list[torch.Tensor]]:
    """A client's secret randomness for one round of example-level DP-SGD, read from its round
    key (:class:`fedpriv.keys.randomness.ClientDraws`): the noise stream (ChaCha20 under the key's
    noise subkey) and the Poisson mask of every step (row i joins step k's batch iff its k-th
    mask uniform is below q). The per-client loop and the cohort-parallel trainer
    (:mod:`fedpriv.round.cohort_parallel`) both draw it here."""
    noise = GaussianKeystream(draws.noise_key)
    masks = [torch.from_numpy(draws.mask_uniforms(k, num_rows) < dp.sampling_rate) for k in range(dp.steps)]
    return noise, masks


def dp_sgd_steps(model: nn.Module, bk: BookKeeping, rows: np.ndarray, lr: float, dp: ExampleDP,
                 draws: ClientDraws, pad_id: int) -> int:
    """Run ``dp.steps`` example-level DP-SGD steps on ``model`` in place (hooked by ``bk``, whose
    clip norm and noise multiplier must be ``dp``'s); returns the number of steps. Nothing about
    the rows (their count, their loss) leaves this function but the model."""
    if bk.clip_norm != dp.clip_norm or bk.noise_multiplier != dp.noise_multiplier:
        raise ValueError("the BookKeeping engine does not carry the client's example-level settings")
    params = [p for p in model.parameters() if p.requires_grad]
    data = rows_tensor(rows, params[0].device)
    bk.noise, masks = example_schedule(len(data), dp, draws)
    for mask in masks:
        batch = data[mask.to(data.device)]
        if len(batch):
            ce, count = sequence_token_losses(model, batch, pad_id)
            per_example = ce / count.clamp(min=1)
            bk.backward(per_example)
        else:  # noise-only step: the release the accountant counts still happens
            for p in params:
                p.grad = torch.zeros_like(p)
            bk.noise.add_([p.grad for p in params], dp.noise_multiplier * dp.clip_norm)
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-lr / dp.denominator)
                p.grad = None
    return dp.steps
