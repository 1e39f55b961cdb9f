"""Independent Gaussian noise on the clipped sum (DP-FedAvg / DP-SGD).

Round t releases ``sum_u clip(Δ_u, C) + N(0, σ² C² I)``. With Poisson sampling of rate q this is
``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` per round under add/remove-one. With fixed-size
sampling without replacement the relation is replace-one, under which the sum's L2 sensitivity is
2C, so the event carries the multiplier σ/2 per unit of sensitivity.
"""

from __future__ import annotations

import dp_accounting
import torch

from fedpriv.errors import ConfigError
from fedpriv.randomness import NoiseStream
from fedpriv.sampling import FIXED_SIZE, POISSON, Sampler

ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE

RELATION_NAMES = {
    ADD_REMOVE: "add_or_remove_one",
    REPLACE_ONE: "replace_one",
    dp_accounting.NeighboringRelation.REPLACE_SPECIAL: "zero_out",
}


def require_noise(noise: NoiseStream | None, name: str) -> NoiseStream:
    """The mechanism's noise stream; a mechanism built for accounting only has none (fail closed)."""
    if noise is None:
        raise ValueError(f"the {name} mechanism was built for accounting only (no noise stream): it cannot add noise")
    return noise


def noise_state(noise: NoiseStream | None) -> dict | None:
    """A mechanism's stream position for its ``state_dict`` (None: an accounting-only mechanism)."""
    return None if noise is None else noise.state_dict()


def load_noise_state(noise: NoiseStream | None, state: dict | None, name: str) -> None:
    """Restore the stream position :func:`noise_state` saved."""
    if state is not None:
        require_noise(noise, name).load_state_dict(state)


def trivial_event(noise_multiplier: float, rounds: int) -> dp_accounting.DpEvent | None:
    """The event when no accounting is needed: non-private (σ = 0) or nothing released yet."""
    if noise_multiplier == 0.0:
        return dp_accounting.NonPrivateDpEvent()
    if rounds == 0:
        return dp_accounting.NoOpDpEvent()
    return None


class GaussianMechanism:
    """Adds ``N(0, (noise_multiplier * clip_norm)^2)`` to every coordinate of a round's sum.

    Draws come from ``noise`` (:class:`~fedpriv.randomness.NoiseStream`, keyed by the run key:
    secret in secure mode); its position is part of ``state_dict``, so a resumed run continues the
    same stream. ``noise=None``: a mechanism that only states its accounting (calculators).
    """

    name = "gaussian"
    independent_noise = True  # z_t independent across rounds: the plan may add independent queries (unit_noise)

    def __init__(self, noise_multiplier: float, clip_norm: float, noise: NoiseStream | None = None) -> None:
        if noise_multiplier < 0:
            raise ConfigError(f"noise multiplier must be >= 0, got {noise_multiplier}")
        if clip_norm <= 0:
            raise ConfigError(f"clip norm must be > 0, got {clip_norm}")
        self.noise_multiplier = float(noise_multiplier)
        self.clip_norm = float(clip_norm)
        self._noise = noise

    @property
    def std(self) -> float:
        """Noise standard deviation per coordinate of the sum: σ·C."""
        return self.noise_multiplier * self.clip_norm

    def noise(self, round_idx: int, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
        """Noise for round ``round_idx`` (rounds must be drawn in order; the index is a check)."""
        del round_idx  # independent noise: the stream position is the stream's state
        if self.noise_multiplier == 0.0:
            return torch.zeros(shape)
        return require_noise(self._noise, self.name).normal(shape) * self.std

    def unit_noise(self, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
        """``N(0, I)`` from the same (checkpointed) stream — for a second query of the round
        whose scale the caller sets (the IME squares of :mod:`fedpriv.optim.adaptive`)."""
        return require_noise(self._noise, self.name).normal(shape)

    def matrix(self, rounds: int) -> torch.Tensor:
        """Round t's noise is the t-th unit draw (times σC): the identity, float64."""
        return torch.eye(rounds, dtype=torch.float64)

    def neighboring_relation(self, sampler: Sampler) -> dp_accounting.NeighboringRelation:
        if sampler.kind == POISSON:
            return ADD_REMOVE
        if sampler.kind == FIXED_SIZE:
            return REPLACE_ONE
        raise ConfigError(f"gaussian mechanism cannot be accounted with sampler {sampler.kind!r}")

    def round_event(self, sampler: Sampler, noise_multiplier: float | None = None) -> dp_accounting.DpEvent:
        """The DpEvent of one round under ``sampler`` (``noise_multiplier`` overrides σ, for calibration)."""
        sigma = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        if sigma == 0.0:
            return dp_accounting.NonPrivateDpEvent()
        if sampler.kind == POISSON:
            return dp_accounting.PoissonSampledDpEvent(sampler.rate, dp_accounting.GaussianDpEvent(sigma))
        if sampler.kind == FIXED_SIZE:
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
        return dp_accounting.SelfComposedDpEvent(self.round_event(sampler, noise_multiplier), rounds)

    def state_dict(self) -> dict:
        return {"name": self.name, "noise_multiplier": self.noise_multiplier,
                "clip_norm": self.clip_norm, "noise": noise_state(self._noise)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("name") != self.name:
            raise ValueError(f"checkpoint holds mechanism {state.get('name')!r}, not {self.name!r}")
        self.noise_multiplier = float(state["noise_multiplier"])
        self.clip_norm = float(state["clip_norm"])
        load_noise_state(self._noise, state["noise"], self.name)
