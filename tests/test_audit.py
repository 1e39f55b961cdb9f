"""The empirical privacy audit: the one-run bound's statistics (coverage, agreement with
independent implementations), canary units, and audits of small runs (honest, non-private,
planted bugs) for every mechanism and algorithm."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, compose_cfg

from fedpriv.round.aggregation import RoundAggregate
from fedpriv.audit.bound import epsilon_lower_bound, guess_grid, one_run_audit, p_value
from fedpriv.audit.canaries import CanarySet
from fedpriv.audit.estimate import estimate_epsilon, gaussian_epsilon
from fedpriv.errors import ConfigError
from fedpriv.keys.research_key import key_from_seed
from fedpriv.sampling import make_sampler
from tests.warm_launcher import run_module


# --- the one-run bound -------------------------------------------------------------------------

def _reference_bound(m: int, r: int, v: int, delta: float, confidence: float) -> float:
    """An independent implementation (no scipy): binomial probabilities from ``math.lgamma``, tails
    as suffix sums, epsilon on a bisection of its own."""
    level = 1 - confidence

    def p(eps: float) -> float:
        q = 1 / (1 + math.exp(-eps))
        log_q, log_1q = math.log(q), (math.log1p(-q) if q < 1 else -math.inf)
        pmf = [math.exp(math.lgamma(r + 1) - math.lgamma(j + 1) - math.lgamma(r - j + 1) + j * log_q
                        + ((r - j) * log_1q if r > j else 0.0)) for j in range(r + 1)]
        suffix = [0.0] * (r + 2)  # suffix[k] = P[Binomial(r, q) >= k]
        for j in range(r, -1, -1):
            suffix[j] = suffix[j + 1] + pmf[j]
        beta = suffix[v]
        alpha = max(((suffix[v - i] - beta) / i for i in range(1, v + 1)), default=0.0)
        return min(1.0, beta + 2 * m * delta * alpha)

    if v == 0 or p(0.0) > level:
        return 0.0
    lo, hi = 0.0, 20.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p(mid) <= level else (lo, mid)
    return lo


CASES = [(2000, 100, 100, 0.0, 0.95), (1000, 50, 48, 1e-5, 0.95), (500, 200, 150, 1e-6, 0.95),
         (1000, 20, 20, 1e-5, 0.99), (100, 30, 25, 1e-4, 0.9), (200, 10, 10, 0.0, 0.95)]


def test_sanity_value_from_the_paper_setting():
    # 2000 canaries, 100 guesses all right, delta 0, 95%: epsilon ≈ 3.49
    assert epsilon_lower_bound(2000, 100, 100, 0.0) == pytest.approx(3.493, abs=2e-3)


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_bound_agrees_with_an_independent_exact_implementation(case):
    assert epsilon_lower_bound(*case) == pytest.approx(_reference_bound(*case), abs=1e-4)


def test_bound_agrees_with_jax_privacy():
    """jax_privacy's one-run audit (the ``audit-reference`` extra), run in its own process."""
    probe = subprocess.run([sys.executable, "-c", "import jax_privacy.auditing"], capture_output=True)
    if probe.returncode:
        pytest.skip("jax_privacy is not installed (pip install -e '.[audit-reference]')")
    script = ("import json, sys\nfrom jax_privacy import auditing as a\n"
              "print(json.dumps([a._epsilon_one_run(0, m, r, v, 1 - c, d) for m, r, v, d, c in json.load(sys.stdin)]))")
    out = subprocess.run([sys.executable, "-c", script], input=json.dumps(CASES), capture_output=True, text=True,
                         check=True, env={"JAX_PLATFORMS": "cpu", "PATH": ""})
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    for case, eps in zip(CASES, theirs):
        assert epsilon_lower_bound(*case) == pytest.approx(eps, abs=1e-4), case


def test_bound_cli_agrees_and_refuses_bad_counts(capsys):
    from fedpriv.audit.__main__ import main

    m, r, v, d, c = CASES[1]
    res = run_module("fedpriv.audit", "bound", "--canaries", str(m), "--guesses", str(r),
                     "--correct", str(v), "--delta", str(d), "--confidence", str(c), "--json", cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["epsilon_lower_bound"] == pytest.approx(_reference_bound(m, r, v, d, c), abs=1e-4)
    for m, r, v, d, c in CASES[2:4]:
        assert main(["bound", "--canaries", str(m), "--guesses", str(r), "--correct", str(v), "--delta", str(d),
                     "--confidence", str(c), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["epsilon_lower_bound"] == pytest.approx(_reference_bound(m, r, v, d, c), abs=1e-4)
    for bad in (["--canaries", "10", "--guesses", "20", "--correct", "5", "--delta", "0"],
                ["--canaries", "10", "--guesses", "5", "--correct", "5", "--delta", "1e-5", "--confidence", "1.5"],
                ["--canaries", "10", "--guesses", "x", "--correct", "5", "--delta", "0"],
                ["--canaries", "10", "--guesses", "5", "--correct", "5", "--delta", "nan"]):
        with pytest.raises(SystemExit) as exit_:
            main(["bound", *bad])
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert exit_.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), captured.err
        assert captured.out == ""


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_p_value_grows_with_epsilon(case):
    m, r, v, delta, _ = case
    values = [p_value(m, r, v, eps, delta) for eps in np.linspace(0, 6, 25)]
    assert all(a <= b + 1e-15 for a, b in zip(values, values[1:]))


def test_randomized_response_coverage_is_tight():
    """epsilon-DP randomized response, every canary guessed: the number right is Binomial(m, q),
    so the bound exceeds the true epsilon in at most 5% of trials — and not much less (the test
    is sharp: a bound that is too large or vacuous fails it)."""
    rng = np.random.default_rng(1)
    m, eps, trials = 100, 1.0, 3000
    correct = rng.binomial(m, 1 / (1 + math.exp(-eps)), size=trials)
    bounds = {v: epsilon_lower_bound(m, m, int(v), 0.0) for v in np.unique(correct)}
    rate = np.mean([bounds[v] > eps for v in correct])
    assert 0.025 <= rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials), rate


def test_gaussian_mechanism_coverage():
    """A bare Gaussian mechanism (no model): canary j's output is b_j·mu + N(0, 1), so each coin is
    mu-GDP, with epsilon at delta from dp_accounting's PLD accountant. Over many seeds the audit
    (guess counts chosen after the scores, corrected) exceeds it in at most ~5% of trials."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    m, mu, delta, trials = 500, 2.0, 1e-5, 100
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(1 / mu))
    true_eps = accountant.get_epsilon(delta)
    rng = np.random.default_rng(2)
    bounds = []
    for _ in range(trials):
        coins = rng.random(m) < 0.5
        scores = coins * mu + rng.standard_normal(m)
        bounds.append(one_run_audit({"x": scores}, coins, delta).epsilon_lower_bound)
    bounds = np.asarray(bounds)
    assert np.mean(bounds > true_eps) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)
    assert np.median(bounds) > 1.5  # the audit has power here (m = 500 cannot show much more than 3)


def test_multiplicity_correction_counts_every_pair():
    coins = np.array([1, 0] * 50, dtype=bool)
    scores = {"a": coins + 0.0, "b": -(coins + 0.0)}
    result = one_run_audit(scores, coins, 1e-5)
    assert result.hypotheses == 2 * len(guess_grid(100)) and result.score == "a"
    best_k = result.guesses
    assert result.epsilon_lower_bound == pytest.approx(
        epsilon_lower_bound(100, best_k, best_k, 1e-5, 1 - 0.05 / result.hypotheses), abs=1e-5)


def test_gaussian_estimate_matches_the_gaussian_mechanism():
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    for mu in (0.5, 1.0, 2.0):
        accountant = pld_privacy_accountant.PLDAccountant()
        accountant.compose(dp_accounting.GaussianDpEvent(1 / mu))
        assert gaussian_epsilon(mu, 1.0, 0.0, 1.0, 1e-5) == pytest.approx(accountant.get_epsilon(1e-5), abs=1e-4)
    # symmetric in the two orders, and unequal variances give a larger epsilon than either alone
    assert gaussian_epsilon(0.0, 1.0, 1.0, 2.0, 1e-5) == pytest.approx(gaussian_epsilon(1.0, 2.0, 0.0, 1.0, 1e-5))
    assert gaussian_epsilon(1.0, 2.0, 0.0, 1.0, 1e-5) > gaussian_epsilon(1.0, 1.0, 0.0, 1.0, 1e-5)
    fit = estimate_epsilon(np.random.default_rng(0).normal(1, 1, 20000), np.random.default_rng(1).normal(0, 1, 20000),
                           1e-5)
    assert fit["epsilon_estimate"] == pytest.approx(gaussian_epsilon(1, 1, 0, 1, 1e-5), rel=0.05)
    assert fit["epsilon_equal_variance"] == pytest.approx(gaussian_epsilon(1, 1, 0, 1, 1e-5), rel=0.05)


def test_a_gaussian_estimate_at_the_search_ceiling_is_printed_as_a_bound():
    """Edge 5: the audit printed "Gaussian-fit estimate 100" against a claim of 50, and 100 was the
    search's ceiling — returned as soon as δ(64) > δ, so ε̂ = 78 (μ = 9) read as 100 too. An
    estimate below the ceiling is found; one at it is printed ">= 100 (saturated)"."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    from fedpriv.audit.estimate import EPS_MAX
    from fedpriv.audit.report import analyse, audit_figure, headline

    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(1 / 9.0))
    assert gaussian_epsilon(9.0, 1.0, 0.0, 1.0, 1e-5) == pytest.approx(accountant.get_epsilon(1e-5), abs=1e-4)
    assert gaussian_epsilon(12.0, 1.0, 0.0, 1.0, 1e-5) == EPS_MAX  # 122 by PLD: beyond the ceiling
    rng = np.random.default_rng(0)
    m = 200
    coins = rng.random(m) < 0.5
    noise = rng.standard_normal(2 * m)

    def scores(shift: float) -> dict[str, list[float]]:  # inserted canaries shifted by ``shift`` std
        values = [float(x) for x in np.concatenate([shift * coins, np.zeros(m)]) + noise]
        return {"max_round": values, "final": values}

    record = {"canaries": m, "coins": [int(c) for c in coins], "delta": 1e-5, "confidence": 0.95,
              "claimed_epsilon": 50.0, "scores": scores(50.0)}
    result = analyse(record)
    assert result["epsilon_estimate"] == EPS_MAX and result["epsilon_estimate_saturated"] is True
    line = headline(result)
    assert "Gaussian-fit estimate >= 100 (max_round, saturated)" in line and "estimate 100" not in line
    assert "estimate >= 100 (saturated)" in audit_figure(record, result)._suptitle.get_text()
    record["scores"] = scores(2.0)  # no saturation
    result = analyse(record)
    assert result["epsilon_estimate"] < EPS_MAX and result["epsilon_estimate_saturated"] is False
    assert "saturated" not in headline(result)


# --- canary units --------------------------------------------------------------------------------

def _canaries(kind="poisson", count=50, dim=3000, support=500, seed=0, **kw):
    sampler = make_sampler(kind, 400, 40, key_from_seed(99), **kw)
    return CanarySet(count, dim, 0.5, key_from_seed(seed), sampler, support=support)


def test_canary_directions_are_unit_and_sparse_and_keyed():
    c = _canaries()
    assert c.index.shape == (100, 500) and all(len(set(row.tolist())) == 500 for row in c.index[:5])
    torch.testing.assert_close(torch.linalg.vector_norm(c.value, dim=1), torch.ones(100))
    again, other = _canaries(), _canaries(seed=1)
    assert torch.equal(c.index, again.index) and np.array_equal(c.coins, again.coins)
    assert not torch.equal(c.value, other.value)
    dense = _canaries(support=0)
    assert dense.index is None and dense.value.shape == (100, 3000)


def test_canary_contribution_is_clipped_to_exactly_c():
    c = _canaries()
    for j in range(3):
        delta = c.delta(j)
        assert float(delta.norm()) > 0.5  # past the bound
        agg = RoundAggregate.zeros(3000, 0.5)
        agg.add(delta, tally=False)
        assert float(agg.total.norm()) == pytest.approx(0.5, rel=1e-6)
        assert agg.accepted == 0 and not agg.norms  # canaries stay out of the round's statistics
        assert c.cosines(delta)[j] == pytest.approx(1.0, abs=1e-6)


def test_canaries_follow_the_samplers_participation_pattern():
    poisson = _canaries()
    rate = np.mean([len(poisson.sampler.sample_extra(t, poisson.key, 20000)) / 20000 for t in range(5)])
    assert rate == pytest.approx(0.1, abs=4 * math.sqrt(0.1 * 0.9 / 1e5))
    # only inserted canaries (coin 1) join
    assert all(poisson.coins[poisson.participants(t)].all() for t in range(3))

    cyclic = _canaries(kind="cyclic")  # 10 blocks: each canary in exactly one round of every 10
    rounds = [set(cyclic.sampler.sample_extra(t, cyclic.key, 50).tolist()) for t in range(30)]
    for j in range(50):
        joined = [t for t, r in enumerate(rounds) if j in r]
        assert len(joined) == 3 and all(b - a == 10 for a, b in zip(joined, joined[1:]))

    grouped = _canaries(kind="cyclic_poisson", groups=4)  # rounds of its group only
    seen = {}
    for t in range(40):
        for j in grouped.sampler.sample_extra(t, grouped.key, 50):
            seen.setdefault(int(j), set()).add(t % 4)
    assert seen and all(len(g) == 1 for g in seen.values())
    # rate group_rate in its group's rounds
    joined = np.mean([len(grouped.sampler.sample_extra(t, grouped.key, 40000)) for t in range(4)]) / (40000 / 4)
    rate = grouped.sampler.group_rate
    assert joined == pytest.approx(rate, abs=4 * math.sqrt(rate * (1 - rate) / 40000))

    with pytest.raises(ConfigError, match="sampling=fixed"):
        _canaries(kind="fixed")


# --- audits of small runs --------------------------------------------------------------------------

SMALL = ("+experiment=smoke", "rounds=10", "privacy.target_epsilon=2", "privacy.delta=1e-5", "audit.canaries=500",
         "progress=false")


def _audit(tmp_path, *extra, name="r"):
    from fedpriv.runner import prepare
    from server.app import run_local

    summary = run_local(prepare(compose_cfg(*SMALL, *extra, run_dir=tmp_path / name)))
    return summary, tmp_path / name


def test_honest_run_passes_and_writes_its_audit(tmp_path, run_cli):
    summary, run = _audit(tmp_path)
    audit = summary["audit"]
    assert audit["claimed_epsilon"] == pytest.approx(2.0, abs=1e-3)
    assert audit["epsilon_lower_bound"] <= audit["claimed_epsilon"]
    assert {"canaries", "guesses", "correct", "epsilon_lower_bound", "epsilon_estimate", "confidence"} <= set(audit)
    assert (run / "audit.png").stat().st_size > 1000
    saved = json.loads((run / "summary.json").read_text())["audit"]
    res = run_module("fedpriv.audit", str(run), "--json", cwd=ROOT)
    assert res.returncode == 0 and json.loads(res.stdout) == saved
    record = json.loads((run / "audit_scores.json").read_text())
    assert len(record["coins"]) == 500 and len(record["scores"]["max_round"]) == 1000
    assert {"coins", "scores", "delta", "claimed_epsilon", "confidence"} <= set(record)


def test_planted_bug_noise_scaled_down_is_caught(tmp_path, monkeypatch):
    from fedpriv.mechanisms.gaussian import GaussianMechanism

    noise = GaussianMechanism.noise
    monkeypatch.setattr(GaussianMechanism, "noise", lambda self, r, shape: 0.1 * noise(self, r, shape))
    audit = _audit(tmp_path)[0]["audit"]
    assert audit["claimed_epsilon"] == pytest.approx(2.0, abs=1e-3)
    assert audit["epsilon_lower_bound"] > audit["claimed_epsilon"]


def test_planted_bug_clipping_skipped_is_caught(tmp_path, monkeypatch):
    import fedpriv.round.aggregation

    monkeypatch.setattr(fedpriv.round.aggregation, "clip_factor", lambda delta, c: (1.0, float(delta.norm())))
    audit = _audit(tmp_path)[0]["audit"]
    assert audit["epsilon_lower_bound"] > audit["claimed_epsilon"]


def test_non_private_run_audits_to_a_large_bound(tmp_path):
    audit = _audit(tmp_path, "privacy.noise_multiplier=0", "privacy.target_epsilon=null")[0]["audit"]
    assert audit["claimed_epsilon"] is None and audit["epsilon_lower_bound"] > 3.0


@pytest.mark.parametrize("extra", [("mechanism=tree", "optimizer=ftrl", "rounds=4", "cohort_size=10"),
                                   ("mechanism=bandmf", "mechanism.bands=2", "rounds=6"),
                                   ("mechanism=blt", "mechanism.buffers=2", "rounds=4", "cohort_size=10"),
                                   ("algorithm=dp_fedsgd",), ("algorithm=dpsgd", "cohort_size=200"),
                                   ("client.dp=example",), ("optimizer=dpadam_stp",), ("optimizer=dpadam_ime",),
                                   ("privacy.clipping=adaptive", "mechanism=blt", "mechanism.buffers=2", "rounds=4",
                                    "cohort_size=10")],
                         ids=["tree", "bandmf", "blt", "dp_fedsgd", "dpsgd", "client_example_dp", "stp", "ime",
                              "adaptive_clip_blt"])
def test_every_mechanism_and_algorithm_takes_an_audit(tmp_path, extra):
    """Honest (claimed epsilon 20): bound <= claim; and the canaries reach the release (inserted
    ones score higher than never-inserted ones by more than 3 standard errors), so no path drops them."""
    audit = _audit(tmp_path, "privacy.target_epsilon=20", *extra)[0]["audit"]
    assert audit["canaries"] == 500 and 0 <= audit["epsilon_lower_bound"] <= audit["claimed_epsilon"]
    fit = audit["estimates"]["max_round"]
    inserted = audit["inserted"]
    se = math.sqrt(fit["inserted_std"] ** 2 / inserted + fit["never_inserted_std"] ** 2 / (1000 - inserted))
    assert fit["inserted_mean"] - fit["never_inserted_mean"] > 3 * se, fit


def test_secure_mode_canaries_are_fresh_and_research_mode_reproducible(tmp_path):
    def coins(name, *extra):
        _audit(tmp_path, "rounds=2", *extra, name=name)
        return json.loads((tmp_path / name / "audit_scores.json").read_text())["coins"]

    assert coins("r1") == coins("r2")
    assert coins("s1", "privacy.secure_rng=true") != coins("s2", "privacy.secure_rng=true")
    # secure mode: the audit subkey (from the run key, held only by the checkpoint) is in no other file
    from fedpriv.keys.randomness import RunRandomness
    from fedpriv.release.rundir import RunDirectory

    run = RunDirectory(tmp_path / "s1")
    subkey = RunRandomness.from_state(run.load_checkpoint()["randomness"]).subkey("audit")
    others = [p for p in run.path.rglob("*") if p.is_file() and p != run.checkpoint_path]
    assert others and not any(subkey in p.read_bytes() or subkey.hex().encode() in p.read_bytes() for p in others)
    record = json.loads((run.path / "audit_scores.json").read_text())
    assert record["mode"] == "secure" and record["audit_seconds"] is None  # no timing in secure mode


def test_audit_config_is_checked(tmp_path, run_cli):
    for bad, text in (("audit.canaries=1", "audit.canaries"), ("audit.canary=5", "did you mean 'audit.canaries'")):
        res = run_cli("+experiment=smoke", bad, f"run_dir={tmp_path / 'x'}")
        assert res.returncode == 2 and text in res.stderr and res.stderr.startswith("error:"), res.stderr
        assert not (tmp_path / "x").exists()
    from fedpriv.runner import prepare

    with pytest.raises(ConfigError, match="audit.confidence"):
        prepare(compose_cfg("+experiment=smoke", "audit.canaries=10", "audit.confidence=1", run_dir=tmp_path / "y"))
    assert not (tmp_path / "y").exists()
    with pytest.raises(ConfigError, match="sampling=fixed"):
        _audit(tmp_path, "sampling=fixed", name="fixed")


def test_resumed_audit_equals_uninterrupted(tmp_path):
    from fedpriv.runner import prepare
    from server.app import run_local
    from tests.helpers import interrupt_and_resume

    overrides = (*SMALL, "rounds=4", "audit.canaries=50")
    run_local(prepare(compose_cfg(*overrides, run_dir=tmp_path / "full")))
    run_local(interrupt_and_resume(compose_cfg(*overrides, run_dir=tmp_path / "cut"), 2)[1])

    def scores(name):
        record = json.loads((tmp_path / name / "audit_scores.json").read_text())
        return record["coins"], record["scores"]

    assert scores("full") == scores("cut")


def test_too_few_inserted_canaries_still_give_a_bound():
    from fedpriv.audit.report import analyse, headline

    record = {"canaries": 2, "coins": [0, 0], "delta": 1e-5, "confidence": 0.95, "claimed_epsilon": 2.0,
              "scores": {"max_round": [0.1, 0.2, 0.0, 0.3], "final": [0.0, 0.1, 0.2, 0.3]}}
    result = analyse(record)
    assert result["epsilon_estimate"] is None and result["epsilon_lower_bound"] == 0.0
    assert "fewer than 2" in headline(result)


# --- why a bound is 0 (and what to change) -----------------------------------------------------------

def test_p_value_of_zero_epsilon_falls_with_the_number_right_and_the_vector_form_agrees():
    from fedpriv.audit.bound import zero_epsilon_p_values

    for m, k, delta in ((1000, 500, 1e-3), (100, 50, 1e-4), (37, 20, 0.0), (2000, 1000, 1e-5)):
        v = np.arange(k + 1)
        ours = [p_value(m, k, int(x), 0.0, delta) for x in v]
        assert all(a >= b for a, b in zip(ours, ours[1:]))
        assert zero_epsilon_p_values(np.full(v.shape, m), k, v, delta).tolist() == ours


def test_zero_bound_reason_names_the_m_delta_term_and_a_delta_that_can_work():
    from fedpriv.audit.bound import can_certify, certifiable_ceiling, certifiable_counts, likely_inserted
    from fedpriv.audit.report import zero_bound_reason

    reason = zero_bound_reason(1000, 1e-3, 0.95, 0.0, inserted=492)
    assert "2·m·delta = 2 term" in reason and "no guess set can certify epsilon > 0" in reason
    assert "0.0025 each of the 20 (score, guess count) tests" in reason
    advised = float(reason.split("privacy.delta (the audit's delta is the run's) to at most ")[1].split(" ")[0])
    assert can_certify(1000, advised, inserted=likely_inserted(1000))
    assert not can_certify(1000, 1.1 * advised, inserted=likely_inserted(1000))
    # and it says no canary count helps at 1e-3 — true up to the ceiling past which none can
    assert "changing audit.canaries alone does not help" in reason
    assert not certifiable_counts(1e-3, certifiable_ceiling(1e-3)).any()


def test_zero_bound_reason_gives_the_largest_smaller_canary_count():
    from fedpriv.audit.bound import certifiable_counts
    from fedpriv.audit.report import zero_bound_reason

    reason = zero_bound_reason(1000, 5e-4, 0.95, 0.0, inserted=500)
    count = int(reason.split("use audit.canaries=")[1].split(" ")[0])
    ok = certifiable_counts(5e-4, 1000)
    assert ok[count] and not ok[count + 1:1000].any() and not ok[1000]


def test_zero_bound_reason_is_none_for_a_positive_bound_and_names_the_scores_otherwise():
    from fedpriv.audit.report import zero_bound_reason

    bound = epsilon_lower_bound(1000, 100, 100, 1e-5, 1 - 0.05 / 20)
    assert bound > 0 and zero_bound_reason(1000, 1e-5, 0.95, bound, inserted=500) is None
    reason = zero_bound_reason(1000, 1e-5, 0.95, 0.0, inserted=500, top_hits=dict.fromkeys(guess_grid(1000), 1))
    assert reason.startswith("the scores did not separate") and "the best score had 1 there" in reason


def test_zero_bound_is_explained_in_the_headline_the_summary_block_and_the_plot():
    from fedpriv.audit.report import analyse, audit_figure, headline

    rng = np.random.default_rng(0)
    m = 1000
    coins = rng.random(m) < 0.5

    def score():  # well separated: the bound is 0 only because of delta
        return [float(x) for x in np.concatenate([4 * coins + rng.standard_normal(m), rng.standard_normal(m)])]

    record = {"canaries": m, "coins": [int(c) for c in coins], "delta": 1e-3, "confidence": 0.95,
              "claimed_epsilon": 2.0, "scores": {"max_round": score(), "final": score()}}
    result = analyse(record)
    assert result["epsilon_lower_bound"] == 0 and "2·m·delta" in result["zero_bound_reason"]
    line = headline(result)
    assert f"Lower bound 0: {result['zero_bound_reason']}" in line and "0 of 0 guesses" not in line
    fig = audit_figure(record, result)
    assert "lower bound 0: no guess set can certify" in " ".join(fig._suptitle.get_text().split())
    assert all(ax.get_ylabel() for ax in fig.axes)
    record["delta"] = 1e-5
    result = analyse(record)
    assert result["epsilon_lower_bound"] > 0 and result["zero_bound_reason"] is None
    assert "Lower bound 0" not in headline(result) and all(ax.get_ylabel() for ax in audit_figure(record, result).axes)
