"""The queries a round privatizes, as the server optimizer declares them once (its *query plan*),
and the one function that turns a round's clipped aggregate into its release.

Nothing flows upstream in a round except this plan: the optimizer states, before round 1, what it
needs — a jointly privatized sum of squared clipped deltas (IME), the update's noise standard
deviation (BC), a per-coordinate pre-clip scale computed from past releases only (STP), the
noiseless average (the non-private baseline) — and :meth:`QueryPlan.check` checks it once
against what the mechanism and the algorithm can do. ``fedpriv.optim.adaptive`` states the math of
each variant.

Joint query (IME): the update ``Σc_u + N(0, σ₁²C²)`` and the squares ``Σc_u² + N(0, σ₂²C⁴)``
(``c_u`` the clipped delta; ``‖c_u²‖₂ ≤ ‖c_u‖₂² ≤ C²``) are released together. Rescaled to unit
noise per block they are one Gaussian query of L2 sensitivity ``√(1/σ₁² + 1/σ₂²)``; with the split
``σ₁ = σ/√(1−ρ)``, ``σ₂ = σ/√ρ`` that is ``1/σ``: exactly the Gaussian mechanism with multiplier σ
the ledger accounts (:func:`joint_noise_multiplier`, asserted by :meth:`QueryPlan.check`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedpriv.round.aggregation import RoundAggregate
from fedpriv.errors import ConfigError


@dataclass
class RoundRelease:
    """What one round hands the server optimizer."""

    update: torch.Tensor  # Δ̄: the privatized average delta (already divided by s_t under stp)
    noise_std: float | None = None  # per-coordinate std of the noise in ``update`` (independent noise)
    squares: torch.Tensor | None = None  # ime: privatized average of squared clipped deltas
    noiseless: torch.Tensor | None = None  # noiseless average (noiseless variant only; not private)
    unclipped_fraction: float | None = None  # adaptive clipping: the privatized b̃_t


@dataclass(frozen=True)
class QueryPlan:
    """What an optimizer asks of every round (the default: the privatized average delta only)."""

    update_noise_factor: float = 1.0  # the update's noise multiplier is σ · this
    squares_noise_factor: float | None = None  # also release Σ clip(Δ_u)² with multiplier σ · this (IME)
    noise_std: bool = False  # the update's per-coordinate noise std (BC)
    pre_clip_scale: bool = False  # each delta times s_t (from past releases only) before clipping (STP)
    noiseless: bool = False  # the noiseless average too: NOT PRIVATE (analysis baseline)

    @property
    def squares(self) -> bool:
        return self.squares_noise_factor is not None

    def check(self, optimizer: str, mechanism, per_unit_deltas: bool) -> None:
        """Fail closed on a plan the mechanism or the algorithm cannot serve; assert the joint
        query's equivalence to the accounted Gaussian mechanism. What the sum protocol keeps from
        the server is checked by :func:`fedpriv.sums.check_query`."""
        if (self.squares or self.noise_std) and not getattr(mechanism, "independent_noise", False):
            what = "noise split" if self.squares else "bias correction"
            raise ConfigError(f"optimizer={optimizer} needs independent Gaussian noise (mechanism=gaussian): its "
                              f"{what} is derived for it, not for mechanism={mechanism.name}")
        if (self.squares or self.pre_clip_scale) and not per_unit_deltas:
            raise ConfigError(f"optimizer={optimizer} needs each user's delta at the aggregator; the one-pass "
                              "clipped sum has none (use algorithm.one_pass=false)")
        if self.squares:
            joint = joint_noise_multiplier(1.0, self.update_noise_factor, self.squares_noise_factor)
            if not math.isclose(joint, 1.0, rel_tol=1e-12):
                raise ConfigError(f"optimizer={optimizer}: the noise split ({self.update_noise_factor:g}, "
                                  f"{self.squares_noise_factor:g}) is not one Gaussian query with multiplier σ "
                                  f"(joint multiplier {joint:g}·σ)")


def joint_noise_multiplier(sigma: float, update_factor: float, squares_factor: float) -> float:
    """The multiplier of the single Gaussian query equivalent to releasing the update with
    multiplier σ·f₁ and the squares with σ·f₂ (sensitivities C and C²): ``1/√(1/(σf₁)² + 1/(σf₂)²)``."""
    return 1.0 / math.sqrt(1.0 / (sigma * update_factor) ** 2 + 1.0 / (sigma * squares_factor) ** 2)


def privatize(agg: RoundAggregate, noise: torch.Tensor, plan: QueryPlan, mechanism, denominator: float,
              scale: torch.Tensor | None = None, clip=None) -> RoundRelease:
    """The round's release per ``plan``: ``(Σ + z_t·f₁)/D`` (divided by ``s_t`` when scaled before
    clipping), and what else the plan declares. ``noise`` is the mechanism's z_t for the round; the
    squares' noise is drawn after it, from the same stream. With adaptive clipping (``clip``, an
    :class:`~fedpriv.round.adaptive_clipping.AdaptiveClip`) the mechanism runs at unit sensitivity on one
    more coordinate, the centred count's: its update block is scaled by C_t·z_Δ/σ and the count read
    off the last coordinate (the joint query of :mod:`fedpriv.round.adaptive_clipping`)."""
    unit, count_noise = 1.0, 0.0
    if clip is not None:
        noise, count_noise, unit = noise[:-1], float(noise[-1]), clip.update_scale
    update = agg.privatize(noise * (plan.update_noise_factor * unit), denominator)
    if scale is not None:
        update = update / scale
    if clip is not None and clip.release_factor != 1.0:  # normalized step: S/C_t, public (post-processing)
        update = update * clip.release_factor
        unit = unit * clip.release_factor
    release = RoundRelease(update=update)
    if clip is not None:
        release.unclipped_fraction = clip.unclipped_fraction(agg.accepted, agg.clipped, count_noise, denominator)
    if plan.noise_std:
        release.noise_std = mechanism.std * plan.update_noise_factor * unit / denominator
    if plan.squares:
        sigma = mechanism.noise_multiplier
        noise2 = (mechanism.unit_noise(agg.squares.shape) * (sigma * plan.squares_noise_factor * agg.clip_norm ** 2)
                  if sigma else torch.zeros_like(agg.squares))
        release.squares = (agg.squares + noise2) / denominator
    if plan.noiseless:
        release.noiseless = agg.total / denominator
    return release
