"""b-min-separated Poisson participation under Monte-Carlo accounting
(fedpriv/accounting/min_separation.py): the recursion's privacy loss is checked against the two
patterns it contains — p = 1 is balls-in-bins in b bins, b = 1 with C = I is Poisson sampling."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant

from fedpriv.accounting.min_separation import MinSeparationDpEvent, warm_start
from fedpriv.accounting.monte_carlo import BallsInBinsDpEvent, LossSamples, MonteCarloSettings
from fedpriv.errors import ConfigError

SETTINGS = MonteCarloSettings(samples=200_000)


def _close(a: float, b: float, n: int) -> bool:
    """Two estimates of one δ from n samples each: within 5 standard deviations."""
    return abs(a - b) <= 5 * math.sqrt(max(a, b) / n)


def test_certain_participation_is_balls_in_bins():
    """p = 1: a user takes part at its first eligible round, then every b rounds: a uniformly secret
    phase among b (the warm start's stationary law), i.e. balls-in-bins in b bins."""
    column = (1.0, 0.5, 0.25)
    separated = LossSamples(MinSeparationDpEvent(1.0, 12, 4, 1.0, column), SETTINGS, 0.5)
    bins = LossSamples(BallsInBinsDpEvent(1.0, 12, 4, column), SETTINGS, 0.5)
    for eps in (1.0, 2.0):
        assert _close(separated.delta(eps).estimate, bins.delta(eps).estimate, SETTINGS.samples)


def test_no_separation_with_c_identity_is_poisson_sampling():
    """b = 1, C = I: each round independently with probability p — dp_accounting's Poisson-sampled
    Gaussian (PLD, pessimistic by its discretisation) agrees with the estimate, and bounds it."""
    rounds, p, sigma = 20, 0.1, 1.0
    samples = LossSamples(MinSeparationDpEvent(sigma, rounds, 1, p, (1.0,)), SETTINGS, 0.5)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(p, dp_accounting.GaussianDpEvent(sigma)), rounds)
    pld = PLDAccountant(value_discretization_interval=1e-4).compose(event)
    for eps in (0.5, 1.0, 2.0):
        exact, estimate = pld.get_delta(eps), samples.delta(eps)
        assert _close(estimate.estimate, exact, SETTINGS.samples), (eps, estimate, exact)
        assert estimate.upper >= estimate.estimate


def test_warm_start_is_the_stationary_law_of_the_eligibility_chain():
    b, p = 5, 0.3
    start = warm_start(b, p)
    assert start.sum() == pytest.approx(1.0)
    # one round of the chain: eligible -> (took part: wait b-1) w.p. p; waiting j -> waiting j-1
    after = np.zeros(b)
    after[0] = start[0] * (1 - p) + start[1]
    after[1:b - 1] = start[2:b]
    after[b - 1] = start[0] * p
    np.testing.assert_allclose(after, start)


def test_overlapping_columns_and_bad_probabilities_are_refused():
    with pytest.raises(ConfigError, match="at most the separation"):
        MinSeparationDpEvent(1.0, 10, 2, 0.5, (1.0, 0.5, 0.2)).check()
    with pytest.raises(ConfigError, match="probability"):
        MinSeparationDpEvent(1.0, 10, 2, 0.0, (1.0,)).check()
    with pytest.raises(ConfigError, match="non-negative"):
        MinSeparationDpEvent(1.0, 10, 2, 0.5, (1.0, -0.1)).check()
