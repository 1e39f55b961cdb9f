"""b-min-separated Poisson participation under Monte-Carlo accounting
(fedpriv/accounting/min_separation.py): the recursion's privacy loss is checked against the two
patterns it contains — p = 1 is balls-in-bins in b bins, b = 1 with C = I is Poisson sampling."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant

from fedpriv.accounting.min_separation import MinSeparationDpEvent
from fedpriv.sampling import warm_start
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


def test_min_separation_sampler_keeps_participations_apart_at_the_expected_cohort():
    from fedpriv.keys.research_key import key_from_seed
    from fedpriv.sampling import MinSeparationSampler, _MIN_SEP_RUNS, make_sampler

    key = key_from_seed(3)
    sampler = make_sampler("b_min_sep", 2000, 50, key, groups=4, public_population=2000)
    assert isinstance(sampler, MinSeparationSampler)
    assert sampler.probability == pytest.approx(50 / (2000 - 3 * 50))
    cohorts = [sampler.sample(t) for t in range(200)]
    last = np.full(2000, -10**6)
    for t, cohort in enumerate(cohorts):
        assert np.all(t - last[cohort] >= 4)  # at least b rounds between two participations
        last[cohort] = t
    assert np.mean([c.size for c in cohorts]) == pytest.approx(50, rel=0.05)
    # from the key alone: a fresh replay (a resumed run) draws the same cohorts
    _MIN_SEP_RUNS.clear()
    np.testing.assert_array_equal(make_sampler("b_min_sep", 2000, 50, key, groups=4, public_population=2000)
                                  .sample(150), cohorts[150])
    # a user added to the data moves nobody else
    grown = make_sampler("b_min_sep", 2001, 50, key, groups=4, public_population=2000)
    for t in (0, 7, 150):
        np.testing.assert_array_equal(grown.sample(t)[grown.sample(t) < 2000], cohorts[t])


def test_a_run_with_b_min_sep_sampling_claims_its_monte_carlo_bound(tmp_path):
    import json

    from fedpriv.runner import prepare
    from server.app import run_local
    from tests.conftest import compose_cfg

    cfg = compose_cfg("+experiment=smoke", "rounds=4", "eval_every=4", "progress=false", "sampling=b_min_sep",
                      "mechanism=bandmf", "privacy.accountant=mc", "privacy.mc.samples=20000", "privacy.delta=1e-3",
                      "privacy.target_epsilon=20", run_dir=tmp_path / "run")
    run_local(prepare(cfg))
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert privacy["events"][0].startswith("MinSeparationDpEvent(") and privacy["epsilon"] <= 20
    assert privacy["monte_carlo_claim"]["delta_upper"] <= 1e-3
