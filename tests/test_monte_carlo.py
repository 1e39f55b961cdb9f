"""Monte-Carlo accounting of balls-in-bins participation (fedpriv/accounting/monte_carlo.py).

The estimate is checked against closed forms where they exist (one bin: the Gaussian mechanism of
sensitivity √T; two rounds in two bins: a two-dimensional integral), the bound against its stated
confidence in repeated trials, and calibration against its own claim. Sample counts are small:
the statistics tested scale with them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess

import dp_accounting
import numpy as np
import pytest
from scipy.stats import norm

from fedpriv.accounting import monte_carlo as mc
from fedpriv.accounting.accountant import calibrate_noise_multiplier, compute_epsilon
from fedpriv.accounting.monte_carlo import BallsInBinsDpEvent, LossSamples, MonteCarloSettings
from fedpriv.errors import ConfigError
from fedpriv.mechanisms.base import ADD_REMOVE, REPLACE_ONE
from tests.warm_launcher import run_module


def gaussian_delta(mu: float, eps: float) -> float:
    """Exact δ(ε) of the Gaussian mechanism with sensitivity/σ = mu (Balle & Wang 2018)."""
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


def test_one_bin_is_the_gaussian_mechanism_of_all_rounds():
    """b = 1: every user takes part in every round, no amplification: L ~ N(μ²/2, μ²), μ = √T/σ."""
    rounds, sigma = 4, 3.0
    samples = LossSamples(BallsInBinsDpEvent(sigma, rounds, 1, (1.0,)), MonteCarloSettings(samples=400_000), 0.5)
    mu = math.sqrt(rounds) / sigma
    for eps in (0.25, 1.0, 2.0):
        exact = gaussian_delta(mu, eps)
        bound = samples.delta(eps)
        sd = math.sqrt(exact / samples.samples)
        assert abs(bound.estimate - exact) < 5 * sd + 1e-12, (eps, bound, exact)
        assert bound.upper >= exact
        assert bound.upper < exact + 20 * sd  # a bound, not a blank cheque


def _two_bin_exact(sigma: float, eps: float) -> float:
    """δ(ε) of Q = ½N(e_1, σ²I) + ½N(e_2, σ²I) against P = N(0, σ²I) in R², both directions, by
    quadrature on a fine grid."""
    h = 0.004 * sigma
    y = np.arange(-9 * sigma, 1 + 9 * sigma, h)
    y1, y2 = np.meshgrid(y, y, indexing="ij")
    log_p = -(y1 ** 2 + y2 ** 2) / (2 * sigma ** 2)
    log_q = np.logaddexp(-((y1 - 1) ** 2 + y2 ** 2) / (2 * sigma ** 2),
                         -(y1 ** 2 + (y2 - 1) ** 2) / (2 * sigma ** 2)) - math.log(2)
    norm_const = 2 * math.pi * sigma ** 2
    p, q = np.exp(log_p) / norm_const, np.exp(log_q) / norm_const
    remove = np.sum(np.maximum(q - math.exp(eps) * p, 0)) * h * h
    add = np.sum(np.maximum(p - math.exp(eps) * q, 0)) * h * h
    return max(remove, add)


def test_two_rounds_in_two_bins_match_the_integral():
    """C = I, b = T = 2 (each user in one round, at a secret phase): the mixture pair's δ by
    quadrature; the Monte-Carlo estimate agrees and the bound lies above it."""
    sigma = 0.8
    samples = LossSamples(BallsInBinsDpEvent(sigma, 2, 2, (1.0,)), MonteCarloSettings(samples=400_000), 0.5)
    for eps in (0.5, 1.5):
        exact = _two_bin_exact(sigma, eps)
        bound = samples.delta(eps)
        assert abs(bound.estimate - exact) < 5 * math.sqrt(exact / samples.samples), (eps, bound, exact)
        assert bound.upper >= exact


def test_single_participation_is_close_to_poisson_sampling():
    """C = I, b = T: one participation at a uniformly secret round, like Poisson sampling at rate
    1/T over T rounds (random allocation: "Efficient privacy loss accounting for subsampling and
    random allocation", Feldman & Shenfeld, measure it no worse): ε at most Poisson's, and not far below."""
    rounds, sigma = 20, 1.0
    settings = MonteCarloSettings(samples=200_000, confidence=0.9)
    eps_mc = LossSamples(BallsInBinsDpEvent(sigma, rounds, rounds, (1.0,)), settings, 1e-3).epsilon(1e-3, estimate=True)
    poisson = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(1 / rounds, dp_accounting.GaussianDpEvent(sigma)), rounds)
    eps_poisson = compute_epsilon(poisson, 1e-3, "pld")
    assert 0.6 * eps_poisson < eps_mc <= eps_poisson, (eps_mc, eps_poisson)


def test_claimed_epsilon_falls_as_sigma_grows_and_bounds_the_estimate():
    settings = MonteCarloSettings(samples=100_000)
    claims = []
    for sigma in (0.8, 1.0, 1.25, 1.6):
        samples = LossSamples(BallsInBinsDpEvent(sigma, 12, 4, (1.0, 0.5, 0.25)), settings, 1e-3)
        upper, estimate = samples.epsilon(1e-3), samples.epsilon(1e-3, estimate=True)
        assert upper >= estimate
        claims.append(upper)
    assert all(a > b for a, b in zip(claims, claims[1:])), claims


def test_the_bound_holds_at_its_stated_confidence_in_repeated_trials():
    """200 independent accountants (seeds) of a case with a known δ, at confidence 0.9: the bound
    falls below the truth in at most ~10% of them (binomial slack), while the point estimate alone
    does so about a quarter of the time (the larger of two directions' estimates, each below the
    truth half the time: so this test can fail)."""
    rounds, sigma, eps = 1, 1.0, 1.0
    exact = gaussian_delta(1 / sigma, eps)
    below_bound = below_estimate = 0
    trials = 200
    for seed in range(trials):
        settings = MonteCarloSettings(samples=2_000, confidence=0.9, seed=seed)
        bound = LossSamples(BallsInBinsDpEvent(sigma, rounds, 1, (1.0,)), settings, 0.5).delta(eps)
        below_bound += bound.upper < exact
        below_estimate += bound.estimate < exact
    assert below_bound <= 0.1 * trials + 3 * math.sqrt(trials * 0.09)
    assert below_estimate >= 0.15 * trials


def test_kl_upper_bound_is_the_binomial_chernoff_bound():
    # no success in n draws: 1 − γ^{1/n} (what a zero count allows)
    assert mc.kl_upper_bound(0.0, 1000, 0.01) == pytest.approx(1 - 0.01 ** (1 / 1000), rel=1e-9)
    bounds = [mc.kl_upper_bound(m, 10_000, 1e-3) for m in (0.0, 1e-4, 1e-3, 1e-2)]
    assert all(a < b for a, b in zip(bounds, bounds[1:]))
    assert all(b > m for b, m in zip(bounds, (0.0, 1e-4, 1e-3, 1e-2)))
    # more samples, tighter; a smaller failure probability, looser
    assert mc.kl_upper_bound(1e-3, 100_000, 1e-3) < mc.kl_upper_bound(1e-3, 10_000, 1e-3)
    assert mc.kl_upper_bound(1e-3, 10_000, 1e-6) > mc.kl_upper_bound(1e-3, 10_000, 1e-3)


def test_calibration_returns_the_smallest_grid_sigma_whose_claim_fits():
    settings = MonteCarloSettings(samples=20_000)

    def make(sigma: float) -> BallsInBinsDpEvent:
        return BallsInBinsDpEvent(sigma, 30, 10, (1.0,))

    sigma = mc.calibrate(make, 2.0, 1e-2, settings)
    j = mc.grid_index(sigma)
    assert mc.grid_sigma(j) == sigma
    shared = settings.calibrated()
    assert shared.candidates == mc.GRID_SIZE
    assert mc.epsilon(make(sigma), 1e-2, shared) <= 2.0
    assert mc.epsilon(make(mc.grid_sigma(j - 1)), 1e-2, shared) > 2.0
    # the grid correction costs: the same σ claims less without it
    assert mc.epsilon(make(sigma), 1e-2, settings) < mc.epsilon(make(sigma), 1e-2, shared)


def test_accountant_routes_balls_in_bins_to_monte_carlo_only():
    event = BallsInBinsDpEvent(1.0, 10, 5, (1.0,))
    with pytest.raises(ConfigError, match="accountant=mc"):
        compute_epsilon(event, 1e-3, "rdp")
    with pytest.raises(ConfigError, match="b-min-sep participation only"):
        compute_epsilon(dp_accounting.GaussianDpEvent(1.0), 1e-3, "mc")
    with pytest.raises(ConfigError, match="replace-one"):
        compute_epsilon(event, 1e-3, "mc", REPLACE_ONE)
    settings = MonteCarloSettings(samples=20_000)
    eps = compute_epsilon(event, 1e-2, "mc", ADD_REMOVE, monte_carlo_settings=settings)
    assert eps == mc.epsilon(event, 1e-2, settings)  # one deterministic answer per seed
    sigma = calibrate_noise_multiplier(lambda s: BallsInBinsDpEvent(s, 10, 5, (1.0,)), 3.0, 1e-2, "mc",
                                       monte_carlo_settings=settings)
    assert mc.epsilon(BallsInBinsDpEvent(sigma, 10, 5, (1.0,)), 1e-2, settings.calibrated()) <= 3.0


@pytest.mark.parametrize("column, message", [((1.0, -0.1), "non-negative"), ((0.0, 1.0), "first entry"),
                                             ((), "non-empty")])
def test_strategy_columns_outside_the_analysis_are_refused(column, message):
    with pytest.raises(ConfigError, match=message):
        mc.epsilon(BallsInBinsDpEvent(1.0, 10, 5, column), 1e-2, MonteCarloSettings(samples=1000))


def test_too_few_samples_for_the_delta_is_an_error_not_a_claim():
    with pytest.raises(ConfigError, match="cannot bound delta"):
        mc.epsilon(BallsInBinsDpEvent(1.0, 10, 5, (1.0,)), 1e-5, MonteCarloSettings(samples=1000))


def test_toeplitz_modes_are_shifts_of_the_first():
    m = mc.modes((1.0, 0.5), rounds=5, bins=2)
    c = np.array([[1, 0, 0, 0, 0], [0.5, 1, 0, 0, 0], [0, 0.5, 1, 0, 0], [0, 0, 0.5, 1, 0], [0, 0, 0, 0.5, 1]])
    x = np.array([[1, 0], [0, 1], [1, 0], [0, 1], [1, 0]], dtype=float)
    np.testing.assert_allclose(m, c @ x)


def test_samples_are_reproducible_from_the_public_seed_and_differ_across_seeds():
    event = BallsInBinsDpEvent(1.0, 8, 4, (1.0, 0.3))
    a = mc.privacy_losses(event, 5000, 0, True)
    np.testing.assert_array_equal(a, mc.privacy_losses(event, 5000, 0, True))
    assert not np.array_equal(a, mc.privacy_losses(event, 5000, 1, True))


# ---------------------------------------------------------------- issue 41: the samples' law, seeds, shared claims


def test_the_losses_come_from_float64_normals():
    """One bin, one round, σ = 1: under P, L = z − 1/2 exactly. float32 normals (24-bit uniforms,
    |z| <= 5.77 with a staircase tail) would make every L a float32 number; float64 draws do not."""
    event = BallsInBinsDpEvent(1.0, 1, 1, (1.0,))
    losses = mc.privacy_losses(event, 100_000, 0, False)
    assert losses.dtype == np.float64
    assert np.mean(losses.astype(np.float32).astype(np.float64) == losses) < 0.01
    z = losses + 0.5
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.02
    draws = mc.normals(mc.generator(event, 0, 0), (1000,))
    assert str(draws.dtype) == "torch.float64"


def test_one_bin_claim_at_small_delta_covers_the_exact_gaussian_epsilon():
    """b = 1: the pair is the Gaussian mechanism of sensitivity √T/σ, whose exact ε(δ) is known;
    at δ = 1e-6 (the far tail of the samples) the claimed ε lies above it, and not far."""
    from scipy.optimize import brentq

    rounds, sigma, delta = 2, 2.0, 1e-6
    mu = math.sqrt(rounds) / sigma
    exact = brentq(lambda e: gaussian_delta(mu, e) - delta, 1e-6, 50.0, xtol=1e-12)
    samples = LossSamples(BallsInBinsDpEvent(sigma, rounds, 1, (1.0,)), MonteCarloSettings(samples=20_000_000), delta)
    claimed = samples.epsilon(delta)
    assert claimed >= exact, (claimed, exact)
    assert claimed <= exact * 1.15, (claimed, exact)


def test_delta_below_what_the_samples_resolve_is_refused():
    """The samples' uniforms have a 2^-53 grid: a δ claim below MIN_DELTA is refused, whatever the count."""
    with pytest.raises(ConfigError, match="53-bit"):
        mc.check_resolvable(mc.MIN_DELTA / 10, MonteCarloSettings(samples=10 ** 14))
    mc.check_resolvable(1e-5, MonteCarloSettings(samples=10 ** 7))


def test_a_seed_chosen_after_seeing_others_cannot_buy_confidence():
    """Seed k's claims fail with probability γ·6/(π²(k+1)²): summed over every seed, at most γ, so
    re-running with other seeds until one looks lucky still leaves the stated confidence."""
    gamma = 1e-3
    shares = [MonteCarloSettings(confidence=1 - gamma, seed=k).claim_failure for k in range(100_000)]
    assert shares[0] == pytest.approx(gamma * 6 / math.pi ** 2)
    assert shares[9] == pytest.approx(gamma * 6 / (math.pi ** 2 * 100))
    assert sum(shares) <= gamma
    event = BallsInBinsDpEvent(1.0, 12, 4, (1.0,))
    tight = LossSamples(event, MonteCarloSettings(samples=20_000, seed=0), 1e-2).delta(1.0)
    loose = LossSamples(event, MonteCarloSettings(samples=20_000, seed=0, candidates=100), 1e-2).delta(1.0)
    assert loose.upper > tight.upper  # the share is what the bound pays for


def test_the_ledger_splits_the_confidence_over_its_prefix_claims():
    """A run reports the smallest of its prefix checkpoints' claims: each is made at γ/(checkpoints)
    so the smallest holds at 1 − γ (union bound), and calibration uses the same settings."""
    from fedpriv.accounting.ledger import MC_PREFIX_CHECKPOINTS, PrivacyLedger, prefix_checkpoints
    from fedpriv.mechanisms.gaussian import GaussianMechanism
    from fedpriv.keys.research_key import key_from_seed
    from fedpriv.sampling import make_sampler

    assert prefix_checkpoints(16) == [2, 4, 6, 8, 10, 12, 14, 16] and prefix_checkpoints(3) == [1, 2, 3]
    sampler = make_sampler("balls_in_bins", 40, 10, key_from_seed(1), public_population=40)
    settings = MonteCarloSettings(samples=20_000)
    ledger = PrivacyLedger(GaussianMechanism(1.0, 1.0), sampler, 1e-2, accountant="mc", planned_rounds=16,
                           monte_carlo_settings=settings)
    assert ledger.monte_carlo.candidates == MC_PREFIX_CHECKPOINTS
    assert ledger.monte_carlo.claim_failure == pytest.approx(settings.claim_failure / MC_PREFIX_CHECKPOINTS)
    shared = settings.shared(MC_PREFIX_CHECKPOINTS)
    for n in (1, 5, 16):
        expected = min(mc.epsilon(ledger.dp_event(c), 1e-2, shared) for c in prefix_checkpoints(16) if c >= n)
        assert ledger.epsilon(n) == expected
    assert ledger._accountant_settings()["candidates"] == MC_PREFIX_CHECKPOINTS
    with pytest.raises(ValueError, match="cover the planned 16 rounds"):  # outside the union bound
        ledger.epsilon(17)


# ---------------------------------------------------------------- the calculator


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_module("fedpriv.accounting", *args, cwd=os.getcwd())


def test_cli_delta_and_epsilon_for_balls_in_bins():
    base = ["--sampling", "balls_in_bins", "--bins", "4", "--rounds", "12", "--mc-samples", "20000", "--json"]
    out = _cli("delta", "--epsilon", "2", "--noise-multiplier", "1.0", "--mechanism", "bandmf",
               "--strategy-column", "1,0.5", *base)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["accountant"] == "mc"
    assert 0 < result["delta_estimate"] <= result["delta_upper"] < 1
    event = BallsInBinsDpEvent(1.0, 12, 4, (1.0, 0.5))
    expected = LossSamples(event, MonteCarloSettings(samples=20_000), 0.5).delta(2.0)
    assert result["delta_upper"] == pytest.approx(expected.upper, rel=1e-12)
    out = _cli("epsilon", "--noise-multiplier", "1.0", "--delta", "1e-2", *base)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["epsilon"] >= result["epsilon_estimate"] > 0
    assert result["confidence"] == 0.999 and result["candidates"] == 1


def test_cli_refuses_what_cannot_be_accounted():
    bad = _cli("epsilon", "--noise-multiplier", "1", "--delta", "1e-2", "--rounds", "12", "--sampling",
               "balls_in_bins", "--bins", "4", "--mechanism", "bandmf", "--strategy-column", "1,-0.5")
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "non-negative" in bad.stderr
    bad = _cli("epsilon", "--noise-multiplier", "1", "--delta", "1e-2", "--rounds", "12", "--sampling",
               "balls_in_bins")
    assert bad.returncode == 2 and "--bins" in bad.stderr
    bad = _cli("epsilon", "--noise-multiplier", "1", "--delta", "1e-2", "--rounds", "12", "--sampling",
               "balls_in_bins", "--bins", "4", "--accountant", "rdp")
    assert bad.returncode == 2 and "accountant mc" in bad.stderr


# ---------------------------------------------------------------- the sampler and a run


def test_balls_in_bins_sampler_gives_each_user_one_secret_bin_and_its_rounds():
    from fedpriv.keys.research_key import key_from_seed
    from fedpriv.sampling import BallsInBinsSampler, make_sampler

    key = key_from_seed(5)
    sampler = make_sampler("balls_in_bins", 100, 10, key, public_population=100)
    assert isinstance(sampler, BallsInBinsSampler) and sampler.bins == 10 and sampler.expected_cohort == 10.0
    epoch = [sampler.sample(t) for t in range(10)]
    np.testing.assert_array_equal(np.sort(np.concatenate(epoch)), np.arange(100))  # one bin each
    for t in range(10):
        np.testing.assert_array_equal(sampler.sample(t), sampler.sample(t + 10))  # rounds t ≡ bin (mod b)
    # another key, other bins: the bin is the secret
    assert any(not np.array_equal(a, b) for a, b in zip(epoch, (make_sampler(
        "balls_in_bins", 100, 10, key_from_seed(6), public_population=100).sample(t) for t in range(10))))
    # a user added to the data moves nobody else (the public population fixes the bins)
    grown = make_sampler("balls_in_bins", 101, 10, key, public_population=100)
    for t in range(10):
        np.testing.assert_array_equal(grown.sample(t)[grown.sample(t) < 100], epoch[t])
    # canaries: one bin each, the same period
    extra = [sampler.sample_extra(t, key_from_seed(9), 30) for t in range(10)]
    np.testing.assert_array_equal(np.sort(np.concatenate(extra)), np.arange(30))
    np.testing.assert_array_equal(sampler.sample_extra(3, key_from_seed(9), 30),
                                  sampler.sample_extra(13, key_from_seed(9), 30))


def test_bandmf_under_balls_in_bins_needs_a_toeplitz_strategy():
    from fedpriv.mechanisms.bandmf import BandMFMechanism
    from fedpriv.sampling import BinsBound

    bins = BinsBound(bins=4)
    general = BandMFMechanism(1.0, 1.0, rounds=12, bands=3, kind="general", iterations=20)
    with pytest.raises(ConfigError, match="Toeplitz"):
        general.dp_event(bins, 12)
    toeplitz = BandMFMechanism(1.0, 1.0, rounds=12, bands=3, kind="toeplitz", iterations=20)
    event = toeplitz.dp_event(bins, 12)
    assert isinstance(event, BallsInBinsDpEvent) and len(event.column) == 3 and event.bins == 4
    np.testing.assert_allclose(event.column, toeplitz.strategy[:3, 0].numpy())


@pytest.mark.parametrize("mechanism", ["gaussian", "bandmf", "blt"])
def test_a_run_with_balls_in_bins_claims_the_monte_carlo_bound(tmp_path, mechanism):
    from fedpriv.runner import prepare
    from server.app import run_local
    from tests.conftest import compose_cfg

    cfg = compose_cfg("+experiment=smoke", "rounds=4", "eval_every=4", "progress=false", "sampling=balls_in_bins",
                      f"mechanism={mechanism}", "privacy.accountant=mc", "privacy.mc.samples=20000",
                      "privacy.delta=1e-3", "privacy.target_epsilon=20", run_dir=tmp_path / "run")
    run_local(prepare(cfg))
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert privacy["accountant"] == "mc" and privacy["sampling"]["kind"] == "balls_in_bins"
    assert privacy["events"][0].startswith("BallsInBinsDpEvent(")
    claim = privacy["monte_carlo_claim"]
    assert claim["epsilon"] == privacy["epsilon"] <= 20.0
    assert claim["epsilon_estimate"] <= claim["epsilon"]
    assert claim["delta_estimate"] <= claim["delta_upper"] <= 1e-3
    settings = privacy["accountant_settings"]
    # the confidence is shared over the σ grid and the run's 4 prefix claims (rounds 1..4)
    assert settings["candidates"] == mc.GRID_SIZE * 4 and settings["samples_per_direction"] == 20000
    epsilons = [json.loads(line)["epsilon"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
                if "epsilon" in json.loads(line)]
    assert epsilons == sorted(epsilons) and epsilons[-1] == privacy["epsilon"]
    # the result line (and the model card, which quotes it) states the claim's confidence
    from fedpriv.release.result_lines import format_result

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert claim["confidence"] == 0.999
    assert "with probability >= 0.999 (Monte-Carlo bound)" in format_result(summary)


def test_a_resumed_monte_carlo_run_equals_an_uninterrupted_one(tmp_path):
    """The accountant's samples are a function of its public seed and the pattern: a resumed run
    recalibrates to the same σ and claims the same ε; the ledger's checkpoint holds its settings."""
    from fedpriv.runner import prepare
    from server.app import run_local
    from tests.conftest import compose_cfg
    from tests.helpers import interrupt_and_resume

    over = ("+experiment=smoke", "rounds=4", "eval_every=4", "progress=false", "sampling=balls_in_bins",
            "privacy.accountant=mc", "privacy.mc.samples=20000", "privacy.delta=1e-3", "privacy.target_epsilon=20")
    whole = prepare(compose_cfg(*over, run_dir=tmp_path / "w"))
    run_local(whole)
    first, resumed = interrupt_and_resume(compose_cfg(*over, run_dir=tmp_path / "p"), 2)
    assert resumed.start_round == 2
    assert resumed.ledger.state_dict()["config"]["monte_carlo"]["samples_per_direction"] == 20000
    run_local(resumed)
    torch_params = (resumed.server.params, whole.server.params)
    assert bool((torch_params[0] == torch_params[1]).all())
    a = json.loads((tmp_path / "w" / "privacy.json").read_text())
    b = json.loads((tmp_path / "p" / "privacy.json").read_text())
    assert a["epsilon"] == b["epsilon"] and a["noise_multiplier"] == b["noise_multiplier"]
    assert a["monte_carlo_claim"] == b["monte_carlo_claim"]


# ---------------------------------------------------------------- issue 41: the calculator's edges

MC_BASE = ["--noise-multiplier", "1.0", "--delta", "1e-2", "--rounds", "12", "--sampling", "balls_in_bins",
           "--bins", "4"]


@pytest.mark.parametrize("extra, message", [
    (["--population", "3"], "--bins 4 exceeds --population 3"),
    (["--population", "100", "--cohort", "25"], "--cohort does not apply to --sampling balls_in_bins"),
    (["--participations", "2"], "--participations does not apply"),
    (["--sampling-rate", "0.25"], "--sampling-rate does not apply"),
    (["--accountant", "rdp", "--mc-seed", "1"], "applies to the Monte-Carlo accountant only"),
    (["--mc-samples", str(10 ** 15)], "GiB of memory"),
])
def test_cli_refuses_impossible_or_unread_flags(extra, message, capsys):
    from fedpriv.accounting.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["epsilon", *MC_BASE, *extra])
    out = capsys.readouterr()
    assert exit_.value.code == 2 and out.out == ""
    assert out.err.startswith("error:") and len(out.err.strip().splitlines()) == 1 and message in out.err, out.err


def test_cli_monte_carlo_flags_are_refused_by_the_other_accountants(capsys):
    from fedpriv.accounting.__main__ import main

    for flag in (["--confidence", "0.9"], ["--mc-samples", "1000"], ["--mc-seed", "2"]):
        with pytest.raises(SystemExit):
            main(["epsilon", "--noise-multiplier", "1", "--sampling-rate", "0.01", "--rounds", "10", "--delta", "1e-5",
                  "--accountant", "pld", *flag])
        assert "applies to the Monte-Carlo accountant only" in capsys.readouterr().err


def test_cli_uses_the_population_it_is_given(capsys):
    from fedpriv.accounting.__main__ import main

    assert main(["epsilon", *MC_BASE, "--population", "100", "--mc-samples", "2000", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["population"] == 100 and result["expected_cohort"] == 25.0
    assert main(["epsilon", *MC_BASE, "--population", "100", "--mc-samples", "2000"]) == 0
    assert "of 100 users (25 per round expected)" in capsys.readouterr().out


def test_cli_estimates_the_cost_and_reports_progress_on_stderr(monkeypatch, capsys, tmp_path):
    """A long Monte-Carlo computation says how long it will take once its first chunk is drawn,
    then how far it is (here the thresholds are 0 s so that a short one does too). A fresh
    calibration cache: a calibration another test made would be read back, drawing nothing."""
    import fedpriv.accounting.__main__ as cli
    from fedpriv.accounting import calculator

    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(calculator, "PROGRESS_NOTICE_S", 0.0)
    monkeypatch.setattr(calculator, "PROGRESS_EVERY_S", 0.0)
    samples = 3 * mc.CHUNK
    assert cli.main(["epsilon", *MC_BASE, "--mc-samples", str(samples), "--json"]) == 0
    out = capsys.readouterr()
    json.loads(out.out)  # stdout is the result alone
    lines = out.err.splitlines()
    assert lines[0].startswith(f"Monte Carlo (epsilon): {2 * samples:,} samples, about "), lines
    assert lines[-1].startswith(f"Monte Carlo (epsilon): 100% {2 * samples:,} samples in "), lines
    assert len(lines) == 6  # the estimate, then one line per further chunk (3 per direction)
    assert cli.main(["noise", "--target-epsilon", "3", "--delta", "1e-2", "--rounds", "12", "--sampling",
                     "balls_in_bins", "--bins", "4", "--mc-samples", "2000"]) == 0
    assert "per noise multiplier checked" in capsys.readouterr().err


# ---------------------------------------------------------------- the calibration cache


def _counting(monkeypatch) -> list[int]:
    """Count the samples drawn by every privacy-loss sampler (balls-in-bins and b-min-sep)."""
    from fedpriv.accounting import min_separation

    drawn: list[int] = []
    for module, name in ((mc, "privacy_losses"), (min_separation, "losses")):
        original = getattr(module, name)

        def counted(event, samples, *args, _original=original, **kwargs):
            drawn.append(samples)
            return _original(event, samples, *args, **kwargs)
        monkeypatch.setattr(module, name, counted)
    return drawn


def _bib(rounds: int = 12, bins: int = 4):
    return lambda s: BallsInBinsDpEvent(s, rounds, bins, (1.0, 0.5))


def test_a_cached_calibration_draws_no_sample_and_returns_the_same_sigma(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path))
    drawn = _counting(monkeypatch)
    settings = MonteCarloSettings(samples=2000)
    first = mc.calibrate(_bib(), 3.0, 1e-2, settings)
    assert sum(drawn) > 0 and len(list((tmp_path / "monte_carlo").glob("*.pt"))) == 1
    drawn.clear()
    assert mc.calibrate(_bib(), 3.0, 1e-2, settings) == first and drawn == []
    # the same through the accountant's entry point (what the planner and a run call)
    assert calibrate_noise_multiplier(_bib(), 3.0, 1e-2, "mc", monte_carlo_settings=settings) == first
    assert drawn == []


def test_the_b_min_sep_calibration_is_cached_too(monkeypatch, tmp_path):
    from fedpriv.accounting.min_separation import MinSeparationDpEvent

    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path))
    drawn = _counting(monkeypatch)
    make = lambda s: MinSeparationDpEvent(s, 12, 3, 0.2, (1.0, 0.5))  # noqa: E731
    settings = MonteCarloSettings(samples=2000)
    first = mc.calibrate(make, 3.0, 1e-2, settings)
    drawn.clear()
    assert mc.calibrate(make, 3.0, 1e-2, settings) == first and drawn == []


@pytest.mark.parametrize("change", ["epsilon", "delta", "samples", "confidence", "seed", "candidates", "rounds",
                                    "bins", "column", "start"])
def test_the_calibration_key_changes_with_every_input(monkeypatch, tmp_path, change):
    """Any input a calibration's σ depends on makes another entry: the second calibration draws."""
    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path))
    base = {"epsilon": 3.0, "delta": 1e-2, "start": 1.0}
    settings = MonteCarloSettings(samples=2000)
    mc.calibrate(_bib(), 3.0, 1e-2, settings)
    drawn = _counting(monkeypatch)
    make, kwargs = _bib(), dict(base)
    if change in ("epsilon", "delta", "start"):
        kwargs[change] = {"epsilon": 2.5, "delta": 2e-2, "start": 2.0}[change]
    elif change in ("samples", "confidence", "seed", "candidates"):
        settings = dataclasses.replace(settings, **{change: {"samples": 3000, "confidence": 0.99, "seed": 1,
                                                             "candidates": 2}[change]})
    elif change == "column":
        make = lambda s: BallsInBinsDpEvent(s, 12, 4, (1.0, 0.4))  # noqa: E731
    else:
        make = _bib(**{change: {"rounds": 13, "bins": 5}[change]})
    mc.calibrate(make, kwargs["epsilon"], kwargs["delta"], settings, start=kwargs["start"])
    assert sum(drawn) > 0
    assert len(list((tmp_path / "monte_carlo").glob("*.pt"))) == 2


@pytest.mark.parametrize("corruption", ["garbage", "off-grid", "other key"])
def test_a_corrupt_or_mismatched_cache_entry_is_recomputed(monkeypatch, tmp_path, corruption):
    from fedpriv.cache import save_entry

    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path))
    settings = MonteCarloSettings(samples=2000)
    first = mc.calibrate(_bib(), 3.0, 1e-2, settings)
    (path,) = (tmp_path / "monte_carlo").glob("*.pt")
    key = mc.cache_key("calibrate", _bib()(1.0).pattern(), 1e-2, settings.calibrated(), epsilon=3.0, start=1.0)
    if corruption == "garbage":
        path.write_bytes(b"not a torch file")
    elif corruption == "off-grid":
        save_entry(path, key, {"sigma": first * 0.5 + 1e-3})
    else:
        save_entry(path, key + "|tampered", {"sigma": mc.grid_sigma(mc.grid_index(first) - 50)})
    drawn = _counting(monkeypatch)
    assert mc.calibrate(_bib(), 3.0, 1e-2, settings) == first
    assert sum(drawn) > 0


def test_a_preview_claim_is_cached_and_a_run_claims_afresh(monkeypatch, tmp_path):
    """``python -m fedpriv.plan``'s ledger (a preview) reads its Monte-Carlo claims from the cache;
    a ledger a run releases from never does, nor one bound from a preview."""
    from fedpriv.accounting.ledger import PrivacyLedger
    from fedpriv.mechanisms.gaussian import GaussianMechanism
    from fedpriv.sampling import make_sampler

    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path))
    sampler = make_sampler("balls_in_bins", 40, 10, None, public_population=40)
    settings = MonteCarloSettings(samples=2000)

    def ledger(preview: bool) -> PrivacyLedger:
        return PrivacyLedger(GaussianMechanism(2.0, 1.0), sampler, 1e-2, accountant="mc", planned_rounds=8,
                             monte_carlo_settings=settings, preview=preview)

    first = ledger(True).epsilon(8)
    drawn = _counting(monkeypatch)
    preview = ledger(True)
    assert preview.epsilon(8) == first and drawn == []
    release = ledger(False)
    assert sum(drawn) > 0 and release.epsilon(8) == first  # the same samples: the same claim
    drawn.clear()
    bound = preview.bind(GaussianMechanism(2.0, 1.0), sampler, None)
    assert bound.epsilon(8) == first and sum(drawn) > 0
