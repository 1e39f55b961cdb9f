"""DP-FedAvg on the server, independent of any transport: sample, clip, noise, optimize.

One round t flows one way:
1. ``cohort(t)`` — the sampler's draw (the sampling the accountant assumes);
2. the round's replies (client deltas, or a one-pass clipped sum) are added to a
   :class:`~fedpriv.round.aggregation.RoundAggregate`: each delta clipped to C (user-level
   sensitivity), non-finite or malformed ones rejected, summed in user order;
3. :func:`fedpriv.round.queries.privatize` adds the mechanism's noise z_t and divides by the fixed
   expected cohort size — the queries the optimizer declared once in its query plan;
4. the server optimizer steps on the release (post-processing).
The only thing that reaches upstream is the plan (declared before round 1) and, for a
pre-clip-scaled plan, ``s_t``, computed from earlier releases only. An audited run's canaries
(:mod:`fedpriv.audit.canaries`) join step 2 as further units and score each release.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from fedpriv.round.adaptive_clipping import AdaptiveClip
from fedpriv.round.aggregation import RoundAggregate
from fedpriv.errors import ConfigError
from fedpriv.mechanisms import Mechanism
from fedpriv.optim.server import ServerOptimizer
from fedpriv.round.queries import privatize
from fedpriv.round.replies import Replies, RoundInputs
from fedpriv.sampling import Sampler

log = logging.getLogger(__name__)


class DPFedAvg:
    """Server state of DP-FedAvg: global parameters, sampler, noise mechanism, optimizer."""

    def __init__(self, params: torch.Tensor, sampler: Sampler, mechanism: Mechanism,
                 clip_norm: float, optimizer: ServerOptimizer, ema_decay: float = 0.0, canaries=None,
                 clip: AdaptiveClip | None = None) -> None:
        if not 0.0 <= ema_decay < 1.0:
            raise ConfigError(f"ema_decay must be in [0, 1), got {ema_decay}")
        self.params = params.clone()
        self.sampler = sampler
        self.mechanism = mechanism
        self.fixed_clip_norm = clip_norm
        self.clip = clip  # adaptive clipping (fedpriv.round.adaptive_clipping), or None: the fixed bound
        self.optimizer = optimizer
        self.plan = optimizer.query_plan  # declared once (checked by the runner against mechanism and algorithm)
        self.ema_decay = ema_decay
        self.ema = params.clone()
        self.canaries = canaries  # a fedpriv.audit.CanarySet, or None (no audit)
        if canaries is not None:
            canaries.begin(self.model_params)

    @property
    def clip_norm(self) -> float:
        """The bound of the next round: C_t under adaptive clipping (from earlier releases only)."""
        return self.clip.bound if self.clip is not None else self.fixed_clip_norm

    @clip_norm.setter
    def clip_norm(self, value: float) -> None:
        if self.clip is not None:
            raise ValueError("the bound of an adaptive clip follows the privatized count; it is not set by hand")
        self.fixed_clip_norm = float(value)

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

    def round_inputs(self, round_idx: int, cohort: np.ndarray) -> RoundInputs:
        """What round ``round_idx``'s clients (or its one-pass sum) are given: the cohort, the
        current parameters and the round's clip bound (C_t, from earlier releases only)."""
        return RoundInputs(round_idx, cohort, self.params, self.clip_norm)

    def apply_round(self, round_idx: int, cohort: np.ndarray, replies: Replies,
                    diagnostics: bool = False) -> tuple[dict[str, float], dict[str, float]]:
        """Aggregate ``replies`` (from users of ``cohort``: :class:`~fedpriv.round.replies.ClientReplies`,
        summed in user order with the cohort's missing users dropped and foreign, duplicate or
        malformed replies rejected; or a :class:`~fedpriv.round.cohort.CohortSum`, a sum already clipped
        to C per user covering exactly the cohort) into one privatized server step.

        Returns ``(released, diagnostics)``: ``released`` holds only quantities computed from the
        privatized release (covered by the ledger: the adaptive optimizers' ``v_negative_fraction``);
        ``diagnostics`` — empty unless asked for — the statistics of the round's users that the
        ledger does NOT cover (realised cohort size, dropped, rejected, clipped fraction, median
        unclipped norm, clients' training loss), for the research-only diagnostics file.
        """
        opt, plan = self.optimizer, self.plan
        scale = opt.pre_clip_scale() if plan.pre_clip_scale else None  # from earlier releases only
        agg = RoundAggregate.zeros(self.params.numel(), self.clip_norm, squares=plan.squares, scale=scale)
        expected = {int(u) for u in cohort}
        seen, losses = replies.add_to(agg, expected, round_idx)
        if self.canaries is not None:
            self.canaries.add_to(agg, round_idx)
        if self.mechanism.withheld(agg.shares):
            # fewer noise shares survived than the accounting assumes: nothing is released (the
            # round is still charged); survival does not depend on the data (docs/PRIVACY.md)
            log.warning("round %d: %d of the mechanism's noise shares survived, fewer than the %d its accounting "
                        "assumes: the round is withheld (the model does not move)", round_idx + 1, agg.shares,
                        self.mechanism.min_shares)
            return {"withheld": 1.0}, ({"withheld": 1.0, **agg.stats()} if diagnostics else {})
        # adaptive clipping: one more coordinate, the count's, in the same draw (one Gaussian query)
        shape = self.params.shape if self.clip is None else (self.params.numel() + 1,)
        noise = self.mechanism.noise(round_idx, shape)
        release = privatize(agg, noise, plan, self.mechanism, self.sampler.expected_cohort, scale, clip=self.clip)
        if self.canaries is not None:
            self.canaries.observe(release.update)
        self.params, extra = opt.step_release(self.params, release)
        if self.clip is not None:  # C_t (public: from earlier releases) and the privatized fraction
            extra = {**extra, "clip_norm": agg.clip_norm,
                     "privatized_clipped_fraction": 1.0 - release.unclipped_fraction}
            self.clip.step(release.unclipped_fraction)
        if self.ema_decay:
            self.ema = self.ema_decay * self.ema + (1.0 - self.ema_decay) * self.params
        if not diagnostics:
            return extra, {}
        return extra, {"cohort_size": float(len(cohort)), "dropped": float(len(expected - seen)), **agg.stats(),
                       "train_loss": float(np.mean(losses)) if losses else float("nan")}

    def state_dict(self) -> dict:
        # the EMA only when it is released (ema_decay > 0); otherwise it is the iterate itself
        state = {"params": self.params, "ema": self.ema if self.ema_decay else None,
                 "optimizer": self.optimizer.state_dict(),
                 "mechanism": self.mechanism.state_dict()}
        if self.canaries is not None:
            state["canaries"] = self.canaries.state_dict()
        if self.clip is not None:
            state["clip"] = self.clip.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.params = state["params"].clone()
        self.ema = (self.params if state["ema"] is None else state["ema"]).clone()
        self.optimizer.load_state_dict(state["optimizer"])
        self.mechanism.load_state_dict(state["mechanism"])
        if self.canaries is not None:
            self.canaries.load_state_dict(state["canaries"])
        if self.clip is not None:
            self.clip.load_state_dict(state["clip"])
