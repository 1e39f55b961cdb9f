"""DP-FedAvg on the server, independent of any transport: sample, clip, noise, optimize.

One round t:
1. ``cohort(t)`` — the sampler's draw (the sampling the accountant assumes);
2. clients return deltas; ``apply_round`` clips each to C (user-level sensitivity), rejects
   non-finite or malformed ones, sums, adds the mechanism's noise z_t, divides by the fixed
   expected cohort size, and hands the result to the server optimizer (post-processing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fedpriv.aggregation import RoundAggregate
from fedpriv.cohort import CohortSum
from fedpriv.errors import ConfigError
from fedpriv.mechanisms import Mechanism
from fedpriv.optim.adaptive import DPAdaptive, RoundRelease
from fedpriv.optim.server import ServerOptimizer
from fedpriv.sampling import Sampler


@dataclass
class ClientUpdate:
    """What one client sent back; ``delta=None`` marks a malformed reply."""

    user: int
    delta: torch.Tensor | None
    metrics: dict[str, float] = field(default_factory=dict)


class DPFedAvg:
    """Server state of DP-FedAvg: global parameters, sampler, noise mechanism, optimizer."""

    def __init__(self, params: torch.Tensor, sampler: Sampler, mechanism: Mechanism,
                 clip_norm: float, optimizer: ServerOptimizer, ema_decay: float = 0.0) -> None:
        if not 0.0 <= ema_decay < 1.0:
            raise ConfigError(f"ema_decay must be in [0, 1), got {ema_decay}")
        self.params = params.clone()
        self.sampler = sampler
        self.mechanism = mechanism
        self.clip_norm = clip_norm
        self.optimizer = optimizer
        self.ema_decay = ema_decay
        self.ema = params.clone()

    @property
    def model_params(self) -> torch.Tensor:
        """The released model: the EMA of the iterates when ``ema_decay > 0``, else the iterate.

        ``ema_t = d·ema_{t-1} + (1-d)·θ_t`` averages the privatized iterates (post-processing, no
        privacy cost) and damps the noise the iterates carry.
        """
        return self.ema if self.ema_decay else self.params

    def reset(self, params: torch.Tensor) -> None:
        """Make ``params`` the server's model (a public-data stage's output): the iterate and the
        EMA restart from it and the optimizer re-anchors (:meth:`ServerFTRL.reset`); the only way,
        besides a round, that the server's parameters change."""
        self.params = params.clone()
        self.ema = params.clone()
        self.optimizer.reset(self.params)

    def cohort(self, round_idx: int) -> np.ndarray:
        return self.sampler.sample(round_idx)

    def apply_round(self, round_idx: int, cohort: np.ndarray, updates: list[ClientUpdate] | CohortSum,
                    diagnostics: bool = False) -> tuple[dict[str, float], dict[str, float]]:
        """Aggregate ``updates`` (from users of ``cohort``) into one privatized server step.

        Updates are summed in user order so the result does not depend on arrival order.
        Users of the cohort with no reply count as dropped; replies from users outside the
        cohort or duplicates are rejected. A :class:`CohortSum` (the one-pass path) is a sum
        already clipped to C per user; it must cover exactly the cohort.

        Returns ``(released, diagnostics)``: ``released`` holds only quantities computed from the
        privatized release (covered by the ledger: the adaptive optimizers' ``v_negative_fraction``);
        ``diagnostics`` — empty unless asked for — the statistics of the round's users that the
        ledger does NOT cover (realised cohort size, dropped, rejected, clipped fraction, median
        unclipped norm, clients' training loss), for the research-only diagnostics file.
        """
        opt = self.optimizer
        adaptive = isinstance(opt, DPAdaptive)
        scale = opt.client_scale() if adaptive else None
        agg = RoundAggregate.zeros(self.params.numel(), self.clip_norm, squares=adaptive and opt.needs_squares,
                                   scale=scale)
        expected = {int(u) for u in cohort}
        seen: set[int] = set()
        if isinstance(updates, CohortSum):
            if sorted(int(u) for u in updates.users) != sorted(expected):
                raise ValueError(f"round {round_idx}: the one-pass sum does not cover exactly the cohort")
            agg.add_clipped_sum(updates.total, updates.norms)
            seen = expected
            losses = [updates.train_loss]
        else:
            for update in sorted(updates, key=lambda u: u.user):
                if update.user not in expected or update.user in seen:
                    agg.rejected += 1
                    continue
                seen.add(update.user)  # it replied: a malformed reply is rejected, not dropped
                if update.delta is None:
                    agg.rejected += 1
                else:
                    agg.add(update.delta)
            losses = [u.metrics["train_loss"] for u in updates if "train_loss" in u.metrics]
        noise = self.mechanism.noise(round_idx, self.params.shape)
        extra: dict[str, float] = {}
        if adaptive:
            self.params, extra = opt.step_release(self.params, self._release(opt, agg, noise, scale))
        else:
            self.params = opt.step(self.params, agg.privatize(noise, self.sampler.expected_cohort))
        if self.ema_decay:
            self.ema = self.ema_decay * self.ema + (1.0 - self.ema_decay) * self.params
        if not diagnostics:
            return extra, {}
        return extra, {"cohort_size": float(len(cohort)), "dropped": float(len(expected - seen)), **agg.stats(),
                       "train_loss": float(np.mean(losses)) if losses else float("nan")}

    def _release(self, opt: DPAdaptive, agg: RoundAggregate, noise: torch.Tensor,
                 scale: torch.Tensor | None) -> RoundRelease:
        """What an adaptive optimizer sees of the round (``fedpriv.optim.adaptive`` states the math):
        the update with its share σ/√(1−ρ) of the noise under IME, divided by ``s_t`` under STP;
        the update's noise std (BC); the privatized squares with multiplier σ/√ρ on sensitivity
        C² (IME); the noiseless average (the non-private baseline only)."""
        denominator = self.sampler.expected_cohort
        update_factor, squares_factor = opt.noise_split()
        update = agg.privatize(noise * update_factor, denominator)
        if scale is not None:
            update = update / scale
        release = RoundRelease(update=update)
        if opt.needs_noise_std:
            release.noise_std = self.mechanism.std * update_factor / denominator
        if opt.needs_squares:
            sigma = self.mechanism.noise_multiplier
            squares_noise = (self.mechanism.unit_noise(agg.squares.shape) * (sigma * squares_factor * self.clip_norm ** 2)
                             if sigma else torch.zeros_like(agg.squares))
            release.squares = (agg.squares + squares_noise) / denominator
        if opt.non_private_reason:
            release.noiseless = agg.total / denominator
        return release

    def state_dict(self) -> dict:
        return {"params": self.params, "ema": self.ema, "optimizer": self.optimizer.state_dict(),
                "mechanism": self.mechanism.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.params = state["params"].clone()
        self.ema = state["ema"].clone()
        self.optimizer.load_state_dict(state["optimizer"])
        self.mechanism.load_state_dict(state["mechanism"])
