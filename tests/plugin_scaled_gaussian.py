"""An extension registered from a test file: independent Gaussian noise at ``factor`` times the
calibrated multiplier. It is its own module only — the dataclass, the mechanism, one
``register_option`` — and tests/test_plugins.py gives it every mechanism contract test (builds,
states its DpEvent and relation, calibrates, checkpoints, runs a round) without a line here.

conftest.py imports every ``tests/plugin_*.py`` before collection, so registering an option in such
a file is all it takes.

The accounting is its own: the DpEvent at the σ it *would be built with* (``noise_multiplier=``,
what calibration searches over) is the event of ``factor · σ``. Ignoring that factor in
``dp_event`` would make calibration solve for the wrong σ; the calibration contract test fails then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedpriv import schema
from fedpriv.mechanisms.gaussian import GaussianMechanism
from fedpriv.sampling import POISSON


class ScaledGaussianMechanism(GaussianMechanism):
    """``N(0, (factor·σ·C)²)`` per coordinate; accounted as the Gaussian mechanism at ``factor·σ``."""

    name = "scaled_gaussian"

    def __init__(self, noise_multiplier: float, clip_norm: float, factor: float, noise=None) -> None:
        super().__init__(noise_multiplier * factor, clip_norm, noise=noise)
        self.factor = factor

    def dp_event(self, sampler, rounds, noise_multiplier=None):
        scaled = None if noise_multiplier is None else noise_multiplier * self.factor
        return super().dp_event(sampler, rounds, noise_multiplier=scaled)


@dataclass
class ScaledGaussian(schema.MechanismOption):
    default_sampling: ClassVar[str] = POISSON
    name: str = "scaled_gaussian"
    factor: float = 2.0  # the noise std is factor x sigma x C (python -m fedpriv.simulate --help shows this comment)

    def check(self, path: str) -> None:
        schema.positive(self, "factor", path=path)

    def build(self, noise_multiplier, clip_norm, noise=None, rounds=None, sampler=None, dimension=None):
        return ScaledGaussianMechanism(noise_multiplier, clip_norm, self.factor, noise=noise)


schema.register_option("mechanism", "scaled_gaussian", ScaledGaussian())
