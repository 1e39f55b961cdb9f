"""Independent Gaussian noise on the clipped sum (DP-FedAvg / DP-SGD).

Round t releases ``sum_u clip(Δ_u, C) + N(0, σ² C² I)``. With Poisson sampling of rate q this is
``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` per round under add/remove-one. With fixed-size
sampling without replacement the relation is replace-one, under which the sum's L2 sensitivity is
2C, so the event carries the multiplier σ/2 per unit of sensitivity. With balls-in-bins sampling
the T rounds are one ``BallsInBinsDpEvent`` with ``C = I`` (strategy column ``(1,)``), accounted by
Monte Carlo (:mod:`fedpriv.accounting.monte_carlo`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import dp_accounting
import torch

from fedpriv.errors import ConfigError
from fedpriv.mechanisms.base import REPLACE_ONE, NoiseMechanism, amplified_relation, require_noise, trivial_event
from fedpriv.accounting.monte_carlo import BallsInBinsDpEvent
from fedpriv.sampling import POISSON, BallsInBinsPattern, FixedSizePattern, PoissonPattern, Sampler
from fedpriv.schema import MechanismOption, register_option

class GaussianMechanism(NoiseMechanism):
    """Adds ``N(0, (noise_multiplier * clip_norm)^2)`` to every coordinate of a round's sum.

    Draws come from ``noise`` (:class:`~fedpriv.keys.randomness.NoiseStream`, keyed by the run key:
    secret in secure mode); its position is part of ``state_dict``, so a resumed run continues the
    same stream. ``noise=None``: a mechanism that only states its accounting (calculators).
    """

    name = "gaussian"
    independent_noise = True  # z_t independent across rounds: the plan may add independent queries (unit_noise)

    ordered = False  # each round's draw stands alone: the stream position is the whole state

    def _residual(self, draw):
        return draw()

    def unit_noise(self, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
        """``N(0, I)`` from the same (checkpointed) stream — for a second query of the round
        whose scale the caller sets (the IME squares of :mod:`fedpriv.optim.adaptive`)."""
        return require_noise(self._noise, self.name).normal(shape)

    def matrix(self, rounds: int) -> torch.Tensor:
        """Round t's noise is the t-th unit draw (times σC): the identity, float64."""
        return torch.eye(rounds, dtype=torch.float64)

    def neighboring_relation(self, sampler: Sampler) -> dp_accounting.NeighboringRelation:
        if isinstance(sampler, (PoissonPattern, BallsInBinsPattern)):
            return amplified_relation(sampler)
        if isinstance(sampler, FixedSizePattern):
            return REPLACE_ONE
        raise ConfigError(f"gaussian mechanism cannot be accounted with sampler {sampler.kind!r}")

    def round_event(self, sampler: Sampler, noise_multiplier: float | None = None) -> dp_accounting.DpEvent:
        """The DpEvent of one round under ``sampler`` (``noise_multiplier`` overrides σ, for calibration)."""
        sigma = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        if sigma == 0.0:
            return dp_accounting.NonPrivateDpEvent()
        if isinstance(sampler, PoissonPattern):
            return dp_accounting.PoissonSampledDpEvent(sampler.rate, dp_accounting.GaussianDpEvent(sigma))
        if isinstance(sampler, FixedSizePattern):
            # replace-one: sensitivity of the sum is 2C; std σC => multiplier σ/2 per unit sensitivity
            return dp_accounting.SampledWithoutReplacementDpEvent(
                sampler.population, sampler.cohort, dp_accounting.GaussianDpEvent(sigma / 2.0))
        raise ConfigError(f"gaussian mechanism cannot be accounted with sampler {sampler.kind!r}")

    def accounting_details(self, sampler: Sampler, rounds: int) -> dict:
        """Nothing beyond the event: it is exact for this mechanism."""
        del sampler, rounds
        return {}

    def dp_event(self, sampler: Sampler, rounds: int, noise_multiplier: float | None = None) -> dp_accounting.DpEvent:
        """The DpEvent of ``rounds`` rounds: the one source of truth the accountant composes."""
        if isinstance(sampler, BallsInBinsPattern):
            sigma = self.noise_multiplier if noise_multiplier is None else noise_multiplier
            if (trivial := trivial_event(sigma, rounds)) is not None:
                return trivial
            return BallsInBinsDpEvent(sigma, rounds, sampler.bins, (1.0,))
        return dp_accounting.SelfComposedDpEvent(self.round_event(sampler, noise_multiplier), rounds)


# --- config option (fedpriv/schema/parser.py registers it with Hydra) --------------------------


@dataclass
class GaussianNoise(MechanismOption):
    default_sampling: ClassVar[str] = POISSON  # what sampling=auto picks for this mechanism
    name: str = "gaussian"

    def build(self, noise_multiplier: float, clip_norm: float, noise=None, rounds: int | None = None,
              sampler=None, dimension: int | None = None):
        return GaussianMechanism(noise_multiplier, clip_norm, noise=noise)


register_option("mechanism", "gaussian", GaussianNoise())

