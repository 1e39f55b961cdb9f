"""DP adaptive server optimizers ("On Design Principles for Private Adaptive Optimizers").

Every variant updates ``θ`` with a first moment ``m`` and a preconditioner ``v`` built from what
the round releases (:class:`RoundRelease`); they differ in where ``v`` comes from. ``g = −Δ̄`` is
the pseudo-gradient (Δ̄: the privatized average delta), ``B`` the fixed denominator (expected
cohort size), ``σ`` the calibrated noise multiplier and ``C`` the clip norm.

Rules (``rule``): ``adam`` — ``m ← β₁m + (1−β₁)g``, ``v ← β₂v + (1−β₂)s`` with bias
corrections ``m̂ = m/(1−β₁ᵗ)``, ``v̂ = v/(1−β₂ᵗ)``; ``adagrad`` — ``m = g``, ``v ← v + s``,
``v̂ = v``. The step is ``θ ← θ − η m̂ / (√v̂ + ε)`` (``v̂`` floored at ``floor`` where it can be
negative: ``bc``, ``ime``). ``dpadam_post`` with noise is DP-Adam by post-processing; without
noise it is plain Adam (``optimizer=adam`` is the same class).

Variants (``variant``), with ``s`` the second-moment sample of the round:

* ``post`` — ``s = g²`` of the privatized update (post-processing; with noise, ``E[s] = g² + (σC/B)²``
  so ``v̂`` is dominated by the noise variance);
* ``bc`` — bias correction: ``post``'s ``v̂`` minus the known noise variance (``(σC/B)²`` per
  round, summed over rounds for AdaGrad), floored at ``floor``; needs independent Gaussian noise;
* ``ime`` — independent moment estimation: ``s`` is a *separately privatized* average of the
  squared clipped deltas, ``(Σ_u c_u² + N(0, σ₂²C⁴)) / B`` with ``c_u = clip(Δ_u, C)``. Sensitivity
  of that query (add/remove one user): ``‖c_u²‖₂ = (Σᵢ c_{u,i}⁴)^{1/2} ≤ Σᵢ c_{u,i}² = ‖c_u‖₂² ≤ C²``.
  Noise split: the update query gets ``σ₁ = σ/√(1−ρ)`` and the squares ``σ₂ = σ/√ρ``
  (``ρ = ime_fraction``). Released together, (Σc + N(0,σ₁²C²), Σc² + N(0,σ₂²C⁴)) rescaled to unit
  noise per block is one Gaussian query of L2 sensitivity ``√(1/σ₁² + 1/σ₂²) = 1/σ``: exactly a
  Gaussian mechanism with multiplier σ, under the same (Poisson) sampling — the ledger is the
  one of every other variant. Needs independent Gaussian noise;
* ``stp`` — scale-then-privatize: with ``s_t = 1/(√v̂_{t−1} + ε_s)`` (1 before any round; ``ε_s =
  stp_eps``, default the step's ``ε``: a large ``ε_s`` makes ``s_t`` nearly uniform, i.e. ``post``; a
  small one puts large noise on coordinates whose updates are small), every
  delta is multiplied by ``s_t`` *before* clipping (fedpriv clips at the aggregator, where the
  multiplication happens — the same as clients doing it), isotropic noise is added to the scaled
  sum, and the result is divided by ``s_t`` before the ``post`` update. ``s_t`` depends only on
  earlier releases, so this is an adaptive choice of query: the ledger is unchanged.
  ``stp_normalize=rms`` (default) divides ``s_t`` by its root mean square ``(mean_i s_{t,i}²)^{1/2}``:
  a scalar factor on ``s_t`` is the same as the inverse factor on ``C`` (the clip and the noise
  both scale with it; the division by ``s_t`` undoes the rest), so this only keeps ``C`` meaning a
  norm of the size of an unscaled delta — raw ``s_t`` is ≈ ``1/√v̂`` ≫ 1, and a clip tuned for the
  unscaled deltas then clips every scaled one to a sliver. Round 1 (``s = 1``) equals ``post``;
  ``stp_normalize=none`` keeps the raw ``s_t``;
* ``noiseless`` — ``s = g₀²`` of the *noiseless* average (clipped sum / B). NOT PRIVATE: an analysis
  baseline only; runs using it report ``epsilon = inf``.

Diagnostics per round: ``v_negative_fraction`` — the share of coordinates of the bias-corrected
(``bc``) or IME (``ime``) second moment that are negative before flooring.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Literal, Optional

import torch

from fedpriv.errors import ConfigError
from fedpriv.optim.base import ServerOptimizerBase
from fedpriv.round.queries import QueryPlan, RoundRelease
from fedpriv.schema import OptimizerOption, in_unit_interval, positive, register_option

RULES = ("adam", "adagrad")
VARIANTS = ("post", "bc", "ime", "stp", "noiseless")
STP_NORMALIZE = ("rms", "none")


class DPAdaptive(ServerOptimizerBase):
    """A DP adaptive server optimizer (see the module docstring for the math)."""

    def __init__(self, rule: str = "adam", variant: str = "post", lr: float = 0.01, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-3, floor: float = 1e-12, ime_fraction: float = 0.5,
                 stp_normalize: str = "rms", stp_eps: float | None = None) -> None:
        if rule not in RULES:
            raise ConfigError(f"unknown adaptive rule {rule!r} (choose one of: {', '.join(RULES)})")
        if variant not in VARIANTS:
            raise ConfigError(f"unknown adaptive variant {variant!r} (choose one of: {', '.join(VARIANTS)})")
        if stp_normalize not in STP_NORMALIZE:
            raise ConfigError(f"unknown optimizer.stp_normalize {stp_normalize!r} "
                              f"(choose one of: {', '.join(STP_NORMALIZE)})")
        if not 0.0 < ime_fraction < 1.0:
            raise ConfigError(f"optimizer.ime_fraction must be in (0, 1), got {ime_fraction}")
        stp_eps = eps if stp_eps is None else float(stp_eps)
        for name, value in (("lr", lr), ("eps", eps), ("floor", floor), ("stp_eps", stp_eps)):
            if not value > 0:
                raise ConfigError(f"optimizer.{name} must be > 0, got {value}")
        if not (0.0 <= beta1 < 1.0 and 0.0 < beta2 < 1.0):
            raise ConfigError(f"optimizer betas must be in [0, 1) and (0, 1), got {beta1}, {beta2}")
        self.rule, self.variant = rule, variant
        self.lr, self.beta1, self.beta2, self.eps, self.floor = lr, beta1, beta2, eps, floor
        self.ime_fraction, self.stp_normalize, self.stp_eps = ime_fraction, stp_normalize, stp_eps
        self.m: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.noise_var_sum = 0.0  # Σ_t (noise std of Δ̄_t)², the bias AdaGrad's v accumulates
        self.t = 0

    # --- what the aggregation must provide: declared once -------------------------------------
    @property
    def query_plan(self) -> QueryPlan:
        update_factor, squares_factor = self.noise_split()
        return QueryPlan(update_noise_factor=update_factor,
                         squares_noise_factor=squares_factor if self.variant == "ime" else None,
                         noise_std=self.variant == "bc", pre_clip_scale=self.variant == "stp",
                         noiseless=self.variant == "noiseless")

    def pre_clip_scale(self) -> torch.Tensor | None:
        return self.client_scale()

    @property
    def non_private_reason(self) -> str | None:
        if self.variant == "noiseless":
            return f"{self.name} builds its preconditioner from the noiseless updates"
        return None

    @property
    def name(self) -> str:
        if self.variant == "noiseless":
            return f"{self.rule}_noiseless_precond"
        return f"dp{self.rule}_{self.variant}"

    def noise_split(self) -> tuple[float, float]:
        """(factor on the update query's noise, multiplier factor of the squares query): with the
        calibrated σ, the update gets σ/√(1−ρ) and the squares σ/√ρ (``ime``); (1, 0) otherwise."""
        if self.variant != "ime":
            return 1.0, 0.0
        return 1.0 / math.sqrt(1.0 - self.ime_fraction), 1.0 / math.sqrt(self.ime_fraction)

    def client_scale(self) -> torch.Tensor | None:
        """``s_t = 1/(√v̂_{t−1} + ε_s)`` for ``stp``, divided by its RMS under ``stp_normalize=rms``
        (None before the first round and for the other variants)."""
        if self.variant != "stp" or self.v is None:
            return None
        scale = 1.0 / (self.v_hat().sqrt() + self.stp_eps)
        if self.stp_normalize == "rms":
            scale = scale / scale.square().mean().sqrt()
        return scale

    # --- the update ------------------------------------------------------------------------
    def v_hat(self) -> torch.Tensor:
        """The second moment after ``t`` rounds: ``v/(1−β₂ᵗ)`` (adam) or ``v`` (adagrad) — before
        the bias correction of ``bc`` and any floor."""
        return self.v / (1 - self.beta2 ** self.t) if self.rule == "adam" else self.v

    def step(self, params: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        """The ``post`` step on a bare update (what non-adaptive callers provide)."""
        return self.step_release(params, RoundRelease(update=update))[0]

    def step_release(self, params: torch.Tensor, release: RoundRelease) -> tuple[torch.Tensor, dict[str, float]]:
        g = -release.update
        if self.variant == "ime":
            if release.squares is None:
                raise ValueError("dp*_ime needs the privatized squares of the round")
            sample = release.squares
        elif self.variant == "noiseless":
            if release.noiseless is None:
                raise ValueError(f"{self.name} needs the noiseless update of the round")
            sample = release.noiseless * release.noiseless
        else:
            sample = g * g
        if self.m is None:
            self.m, self.v = torch.zeros_like(g), torch.zeros_like(g)
        self.t += 1
        if self.rule == "adam":
            self.m = self.beta1 * self.m + (1 - self.beta1) * g
            self.v = self.beta2 * self.v + (1 - self.beta2) * sample
            m_hat = self.m / (1 - self.beta1 ** self.t)
        else:
            self.m = g
            self.v = self.v + sample
            m_hat = g
        v_hat = self.v_hat()
        stats: dict[str, float] = {}
        if self.variant == "bc":
            if release.noise_std is None:
                raise ValueError("dp*_bc needs the noise standard deviation of the round")
            var = release.noise_std ** 2
            if self.rule == "adam":  # E[v̂] = true second moment + var (constant noise)
                v_hat = v_hat - var
            else:
                self.noise_var_sum += var
                v_hat = v_hat - self.noise_var_sum
        if self.variant in ("bc", "ime"):
            stats["v_negative_fraction"] = float((v_hat < 0).double().mean())
        if self.variant in ("bc", "ime"):  # may be negative: floor it (otherwise v̂ ≥ 0 exactly)
            v_hat = v_hat.clamp_min(self.floor)
        step = m_hat / (v_hat.sqrt() + self.eps)
        return params - self.lr * step, stats

    def state_dict(self) -> dict:
        return {"m": self.m, "v": self.v, "t": self.t, "noise_var_sum": self.noise_var_sum}

    def load_state_dict(self, state: dict) -> None:
        self.m, self.v, self.t = state["m"], state["v"], state["t"]
        self.noise_var_sum = state.get("noise_var_sum", 0.0)


ADAPTIVE_NAMES = {f"dp{rule}_{variant}": (rule, variant) for rule in RULES for variant in VARIANTS
                  if variant != "noiseless"}
ADAPTIVE_NAMES.update({f"{rule}_noiseless_precond": (rule, "noiseless") for rule in RULES})


# --- config options (fedpriv/schema/parser.py registers them with Hydra) -------------------------


@dataclass
class AdamOptimizer(OptimizerOption):
    """``adam``: DP-Adam on the privatized update (= dpadam_post)."""

    name: str = "adam"
    lr: float = 0.01  # server step size
    beta1: float = 0.9  # adam only
    beta2: float = 0.999  # adam only
    eps: float = 0.001  # added to sqrt of the second moment in the denominator

    def check(self, path: str) -> None:
        positive(self, "lr", "eps", path=path)
        in_unit_interval(self, "beta1", path, closed_right=False, open_left=False)
        in_unit_interval(self, "beta2", path, closed_right=False, open_left=False)

    def build(self, rounds: int | None = None):
        rule, variant = ADAPTIVE_NAMES.get(self.name, ("adam", "post"))
        extra = {k: getattr(self, k) for k in ("floor", "ime_fraction", "stp_normalize", "stp_eps") if hasattr(self, k)}
        return DPAdaptive(rule, variant, lr=self.lr, beta1=self.beta1, beta2=self.beta2, eps=self.eps, **extra)


@dataclass
class AdaptiveOptimizer(AdamOptimizer):
    """The DP adaptive variants (fedpriv/optim/adaptive.py states the math)."""

    floor: float = 1.0e-12  # floor of the second moment where it can be negative (bc, ime)
    ime_fraction: float = 0.5  # ime: share rho of the noise budget for the squares

    def check(self, path: str) -> None:
        super().check(path)
        positive(self, "floor", path=path)
        in_unit_interval(self, "ime_fraction", path, closed_right=False)


@dataclass
class STPOptimizer(AdaptiveOptimizer):
    stp_normalize: Literal["rms", "none"] = "rms"  # divide s_t by its RMS so clip_norm keeps its scale
    stp_eps: Optional[float] = None  # s_t = 1/(sqrt(v_hat) + stp_eps); null = eps

    def check(self, path: str) -> None:
        super().check(path)
        positive(self, "stp_eps", path=path)


def _adaptive_options() -> dict[str, OptimizerOption]:
    out: dict[str, OptimizerOption] = {"adam": AdamOptimizer()}
    for rule, lr in (("adam", 0.01), ("adagrad", 0.1)):
        for variant in ("post", "bc", "ime"):
            out[f"dp{rule}_{variant}"] = AdaptiveOptimizer(name=f"dp{rule}_{variant}", lr=lr)
        out[f"dp{rule}_stp"] = STPOptimizer(name=f"dp{rule}_stp", lr=lr)
        out[f"{rule}_noiseless_precond"] = AdaptiveOptimizer(name=f"{rule}_noiseless_precond", lr=lr)
    return out


for _name, _option in _adaptive_options().items():
    register_option("optimizer", _name, _option)

