"""Adaptive clipping: the user-level clip bound C_t follows a target quantile γ of the update norms
through a privatized count ("Differentially Private Learning with Adaptive Clipping", Andrew,
Thakkar, McMahan, Ramaswamy 2021).

Round t (D the fixed denominator, the expected cohort size; s_t a pre-clip scale, if any):

* each accepted user u adds ``c_u = Δ_u · min(1, C_t/‖Δ_u‖)`` to the sum and reports the bit
  ``b_u = 1[‖Δ_u‖ ≤ C_t]``;
* the server releases the update ``(Σ_u c_u + C_t·z_Δ·w_t)/D`` and the unclipped fraction
  ``b̃_t = (Σ_u (b_u − ½) + σ_b·w'_t)/D + ½``, and sets ``C_{t+1} = C_t · exp(−η_C (b̃_t − γ))``
  (a geometric step of the quantile loss in log C).

**One Gaussian query.** Normalised by C_t, user u contributes the vector
``y_u = ((σ/z_Δ) · c_u/C_t, (σ/σ_b) · (b_u − ½))`` of norm² ≤ σ²/z_Δ² + σ²/(4σ_b²), which is exactly 1
when ``z_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2)`` (:func:`update_noise_multiplier`). The stream Σ_u y_u goes
through the run's mechanism unchanged — the same noise multiplier σ at unit sensitivity, the same
stream of (C⁻¹Z)_t for correlated noise, on one more coordinate — so the DpEvent the ledger
composes is the one it composes for a fixed clip. Centring the bit (b_u − ½) makes its share of
a user's norm ½ in every case: add/remove-one (a user's y_u appears or not), zero-out (y_u is
replaced by 0) and replace-one (the difference of two such vectors, norm ≤ 2, as for the sum). The
update and the count are then read off the release by scaling each block back (post-processing):
update noise std z_Δ·C_t, count noise std σ_b per unit of the mechanism's residual.

**Why rescaling is valid for correlated noise.** C_t is a function of the releases of rounds
< t only, so the normalised inputs form an adaptively chosen stream of unit-sensitivity vectors;
the Gaussian matrix mechanism is private for adaptive streams at the same sensitivity ("Improved
Differential Privacy for SGD via Optimal Private Linear Operators on Adaptive Streams", Denisov,
McMahan, Rush, Smith, Thakurta 2022), and multiplying round t's normalised release by the public
C_t is post-processing. What does not carry over is utility: the prefix sums of the *normalised*
noise have the mechanism's optimised error; the rescaled noise Σ_t C_t·w_t has it only while C_t
is constant (it is nearly so once the bound has converged). Under correlated noise the count's
noise is the mechanism's residual on its coordinate, so its std is σ_b times that residual's
(larger than σ_b for the tree, BandMF and BLT).

**The server step (``privacy.adaptive.step``).** ``bound`` (Andrew et al.): the release is
multiplied back by C_t, so the step — signal and noise alike — grows with the bound. At strong
privacy this feeds back: a larger bound adds more noise to the model, the noisier model's users
send larger updates, the bound follows them (measured: C_t reached 10³–10⁶ at ε = 2, docs/RESULTS.md).
``normalized`` (the default): the release is multiplied by the fixed public scale
S = ``privacy.clip_norm`` instead, ``S·(Σ_u c_u/C_t + z)/D``: every user's contribution to the step
has norm ≤ S whatever C_t is, and the noise on the step has the fixed std S·z_Δ/D, so the bound can
no longer amplify the noise; C_t only decides which users are clipped and which are scaled by
1/C_t (the "server step scaled by the current bound"; cf. "Automatic Clipping: Differentially
Private Deep Learning Made Easier and Stronger", Bu et al. 2023, where normalising makes the clip
threshold redundant with the learning rate). The bound starts at ``privacy.adaptive.initial_bound``
(null: S). Multiplying by S/C_t (public, from earlier releases) is post-processing of the same
unit-sensitivity release: the accounting is unchanged.

Assumptions: the bits are computed by the curator from the same deltas it clips (a client never
reports one); rejected replies and audit canaries report no bit (they are out of the count, which
only lowers it: a unit contributes 0 in place of ±½).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedpriv.errors import ConfigError
from fedpriv.schema import Privacy

QUERY = "adaptive_clipping_joint_gaussian"  # how privacy.json names the (sum, count) query
STEPS = ("normalized", "bound")  # privacy.adaptive.step (module docstring)


def update_noise_multiplier(sigma: float, count_noise: float) -> float:
    """``z_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2)``: the update's noise multiplier that makes the (sum, count)
    pair one Gaussian query of multiplier σ (0 when σ = 0: non-private). Needs ``σ < 2σ_b``."""
    if sigma == 0.0:
        return 0.0
    if not count_noise > 0 or not sigma < 2.0 * count_noise:
        raise ConfigError(f"privacy.adaptive.count_noise={count_noise:g} is too small for noise multiplier "
                          f"{sigma:g}: the count alone would spend the whole budget (it needs count_noise > "
                          f"{sigma / 2:g}, and the update's noise grows as it nears that)")
    return 1.0 / math.sqrt(sigma ** -2 - (2.0 * count_noise) ** -2)


def joint_multiplier(update_multiplier: float, count_noise: float) -> float:
    """The multiplier of the single Gaussian query equal to releasing the normalised sum (unit
    sensitivity) with multiplier z_Δ and the centred count (sensitivity ½) with std σ_b."""
    return 1.0 / math.sqrt(update_multiplier ** -2 + (2.0 * count_noise) ** -2)


@dataclass
class AdaptiveClip:
    """The clip bound of each round and its geometric update from the privatized count."""

    bound: float  # C_t, the bound of the next round (C_0 before round 1)
    target_quantile: float  # γ
    learning_rate: float  # η_C
    count_noise: float  # σ_b
    sigma: float  # the mechanism's (accounted) noise multiplier σ
    initial: float = 0.0  # C_0 (set from ``bound`` when left 0)
    server_step: str = STEPS[0]  # "normalized": the release is scaled by ``scale``/C_t; "bound": as is (docstring)
    scale: float = 0.0  # S, the fixed step scale of "normalized" (set from ``initial`` when left 0)

    def __post_init__(self) -> None:
        self.update_multiplier = update_noise_multiplier(self.sigma, self.count_noise)
        self.initial = self.initial or self.bound
        self.scale = self.scale or self.initial
        if self.server_step not in STEPS:
            raise ConfigError(f"unknown adaptive clipping step {self.server_step!r} (choose one of: "
                              f"{', '.join(STEPS)})")

    @property
    def release_factor(self) -> float:
        """What multiplies the round's release (already scaled back by C_t): 1 for ``bound``,
        S/C_t for ``normalized`` (public: C_t comes from earlier releases)."""
        return 1.0 if self.server_step == "bound" else self.scale / self.bound

    @property
    def update_scale(self) -> float:
        """What multiplies the mechanism's unit-sensitivity noise on the update block: C_t·z_Δ/σ."""
        return self.bound * self.update_multiplier / self.sigma if self.sigma else 0.0

    @property
    def count_scale(self) -> float:
        """What multiplies the mechanism's noise on the count coordinate: σ_b/σ."""
        return self.count_noise / self.sigma if self.sigma else 0.0

    def unclipped_fraction(self, accepted: int, clipped: int, noise: float, denominator: float) -> float:
        """``b̃_t = (Σ_u (b_u − ½) + noise·σ_b/σ)/D + ½`` from the round's tallies (``noise`` is the
        mechanism's draw on the count coordinate)."""
        centred = (accepted - clipped) - 0.5 * accepted
        return (centred + noise * self.count_scale) / denominator + 0.5

    def step(self, unclipped: float) -> None:
        """``C_{t+1} = C_t · exp(−η_C (b̃_t − γ))``."""
        self.bound = self.bound * math.exp(-self.learning_rate * (unclipped - self.target_quantile))
        if not (math.isfinite(self.bound) and self.bound > 0):
            raise FloatingPointError(f"the adaptive clip bound left (0, inf): {self.bound}")

    def describe(self) -> dict:
        """What privacy.json states about the query."""
        return {"clipping": "adaptive", "query": QUERY, "initial_clip_norm": self.initial,
                "server_step": self.server_step,
                **({"step_scale": self.scale} if self.server_step == "normalized" else {}),
                "target_quantile": self.target_quantile, "learning_rate": self.learning_rate,
                "count_noise_std": self.count_noise, "update_noise_multiplier": self.update_multiplier,
                "joint_noise_multiplier": (joint_multiplier(self.update_multiplier, self.count_noise)
                                           if self.sigma else 0.0),
                "count_sensitivity": 0.5}

    def state_dict(self) -> dict:
        return {"bound": self.bound}

    def load_state_dict(self, state: dict) -> None:
        self.bound = float(state["bound"])


COUNT_SHARE = 0.1  # the default σ_b leaves the count at most this share of the query's precision σ⁻²


def default_count_noise(expected_cohort: float, sigma: float) -> float:
    """σ_b by default: Andrew et al.'s expected cohort / 20, raised where the noise is strong so that
    the count takes at most ``COUNT_SHARE`` of the query's precision, (2σ_b)⁻² ≤ 0.1·σ⁻², i.e.
    σ_b ≥ σ·√10/2 and z_Δ ≤ σ/√0.9 (at σ = 11.8 and a cohort of 150, m/20 = 7.5 made z_Δ = 19.0:
    the update paid 1.6× the noise of a fixed clip for a count it barely needed)."""
    return max(float(expected_cohort) / 20.0, sigma / (2.0 * math.sqrt(COUNT_SHARE)))


def build_adaptive_clip(privacy: Privacy, sigma: float, expected_cohort: float, squares: bool = False,
                        optimizer: str = "") -> AdaptiveClip | None:
    """The run's adaptive clip (None for ``privacy.clipping=fixed``) from the typed ``privacy``
    section; ``σ_b`` defaults to :func:`default_count_noise`. Refuses a plan whose joint query is
    derived for a fixed clip (IME's squares)."""
    if privacy.clipping != "adaptive":
        return None
    if squares:
        raise ConfigError(f"optimizer={optimizer} releases the squared updates in a noise split derived for a "
                          "fixed clip bound: use privacy.clipping=fixed with it")
    spec = privacy.adaptive
    count_noise = default_count_noise(expected_cohort, sigma) if spec.count_noise is None else float(spec.count_noise)
    initial = float(privacy.clip_norm if spec.initial_bound is None else spec.initial_bound)
    return AdaptiveClip(bound=initial, target_quantile=float(spec.target_quantile),
                        learning_rate=float(spec.learning_rate), count_noise=count_noise, sigma=float(sigma),
                        initial=initial, server_step=spec.step, scale=float(privacy.clip_norm))
