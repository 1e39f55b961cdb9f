"""How much of the mechanism's noise a run's server step carries into the model: the figure the
pre-run warning and ``plan=auto`` read, computed from public quantities only.

The accumulated noise per coordinate of the model over a run of T rounds is

    a = η · C · σ_eff · √T / (m̄ · (1 − β)),    σ_eff = σ · g_M(T),

with η the server learning rate (the peak of a cosine schedule, whose Σ η_t² = 3/8 η² T, is
replaced by √(8/3 · Σ η_t² / T), which equals η), C the clip bound (η·C is the server step: every
update is clipped), σ the noise multiplier, m̄ the expected cohort, β the server momentum (a
heavy-ball step carries each noise draw 1/(1 − β) times into the iterate) and g_M(T) the
mechanism's noise on the iterates relative to independent noise: with round t's noise
σC·(M z)_t (:meth:`fedpriv.mechanisms.base.NoiseMechanism.matrix`), the prefix sums carry
σ²C²·Σ_j (Σ_{s≤t} M[s, j])² per coordinate; g² is its mean over t divided by the independent
noise's, (T + 1)/2. So g = 1 for the Gaussian mechanism, and below 1 for correlated noise that
cancels in the prefix sums (BandMF, BLT, the tree).

``a`` is the standard deviation of a random walk that the noise drives in directions where the
clipped updates carry no signal; cumulative DP noise, not the noise of one step, is what decides
which batch size wins at a fixed compute ("On Optimal Hyperparameters for Differentially Private
Deep Transfer Learning"), and the step size must move with the noise-batch ratio ("Scaling Laws for
Differentially Private Language Models"; "How to DP-fy ML: A Practical Guide to Machine Learning
with Differential Privacy"). The thresholds below are fitted on this repository's measured runs
(docs/PLANNER.md, "Calibration runs").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedpriv.mechanisms.analysis import prefix_mse

# docs/PLANNER.md, "Calibration runs": on both corpora and at both ε the most accurate step sat at
# a = 0.52-0.61 and the lowest loss at a = 0.29-0.30; every run at a >= 1.04 degraded, and a
# paper-scale real-text run at 0.72 did
A_TARGET = 0.5  # the planner's accumulated noise
A_WARN = 0.7  # above it the pre-run line warns
# σ·√d/m̄ above which a run whose optimizer a does not describe is warned about (docs/PRIVACY.md,
# "Will it learn?": the one sweep behind it)
PER_ROUND_WARNING = 10.0


def iterate_noise_factor(mechanism, rounds: int) -> float:
    """g_M(T): the mechanism's noise on the prefix sums of T rounds relative to independent noise
    of the same σ (1 for the Gaussian mechanism); from its explicit noise matrix."""
    if getattr(mechanism, "independent_noise", False):
        return 1.0
    matrix = mechanism.matrix(rounds).to(torch.float64)
    return math.sqrt(float(prefix_mse(matrix)) / ((rounds + 1) / 2))


def accumulated_noise(sigma_eff: float, rounds: int, expected_cohort: float, step: float, momentum: float) -> float:
    """a = step · σ_eff · √T / (m̄ · (1 − β)) with ``step`` = η·C (module docstring)."""
    return step * sigma_eff * math.sqrt(rounds) / (expected_cohort * (1.0 - momentum))


@dataclass(frozen=True)
class NoiseFigure:
    """A run's noise figures: ``sigma_eff`` (σ·g), ``per_round`` (σ·√d/m̄: the noise norm on one
    averaged update in clip bounds), ``accumulated`` (a; None where the server optimizer is not a
    heavy-ball SGD step, which :func:`accumulated_noise` assumes)."""

    sigma_eff: float
    per_round: float
    accumulated: float | None

    @property
    def too_noisy(self) -> bool:
        """Whether the pre-run line warns: a above :data:`A_WARN` (measured runs at this accumulated
        noise degrade), or, where a is not defined, σ·√d/m̄ above :data:`PER_ROUND_WARNING`."""
        if self.accumulated is None:
            return self.per_round > PER_ROUND_WARNING
        return self.accumulated > A_WARN

    def describe(self) -> dict:
        return {"sigma_eff": self.sigma_eff, "averaged_noise_norm_to_clip": self.per_round,
                "accumulated_noise": self.accumulated, "accumulated_noise_warning_above": A_WARN}


def noise_figure(mechanism, noise_multiplier: float, rounds: int, expected_cohort: float, dimension: int,
                 clip_norm: float, step: tuple[float, float] | None) -> NoiseFigure:
    """The figures of a run; ``step``: the server's (learning rate, momentum), None where its
    optimizer is not an SGD step (then no ``a``)."""
    sigma_eff = noise_multiplier * iterate_noise_factor(mechanism, rounds)
    per_round = noise_multiplier * math.sqrt(dimension) / expected_cohort
    accumulated = (None if step is None else
                   accumulated_noise(sigma_eff, rounds, expected_cohort, step[0] * clip_norm, step[1]))
    return NoiseFigure(sigma_eff, per_round, accumulated)
