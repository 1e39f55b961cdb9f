"""Degradation caught (issue 43, item 2): a run whose held-out model got worse says so at its end —
one ``warning:`` line naming the likely cause and the fix, and ``"degraded": true`` in summary.json."""

from __future__ import annotations

import json
import math

from fedpriv.degradation import NOISE, TOO_FEW, UNKNOWN, UNSTABLE, degradation

V = 304  # the smoke vocabulary: ln V = 5.72
UNIGRAM = 0.107


def _history(*evaluations: tuple[float, float], every: int = 2) -> list[dict]:
    """Metrics rows with (test_loss, test_accuracy) every ``every`` rounds, plain rows between."""
    rows = []
    for i, (loss, accuracy) in enumerate(evaluations):
        rows += [{"round": i * every + k + 1, "epsilon": 1.0} for k in range(every - 1)]
        rows.append({"round": (i + 1) * every, "epsilon": 1.0, "test_loss": loss, "test_accuracy": accuracy})
    return rows


def test_a_clean_run_is_not_degraded():
    assert degradation(_history((5.6, 0.05), (5.0, 0.12), (4.8, 0.15)), UNIGRAM, V) is None
    assert degradation(_history((4.9, 0.13), (4.8, 0.14), (4.9, 0.14)), UNIGRAM, V) is None  # +2%: within 5%
    assert degradation([{"round": 1, "epsilon": 1.0}], UNIGRAM, V) is None  # never evaluated: nothing to judge


def test_a_rising_loss_is_degraded_with_its_best_and_rise():
    verdict = degradation(_history((5.1, 0.15), (4.0, 0.20), (4.5, 0.18)), UNIGRAM, V, cohort_size=100, rounds=150,
                          server_lr=1.0)
    assert verdict is not None and verdict.reasons == ("loss rose",)
    assert (verdict.best_loss, verdict.best_round, verdict.final_loss) == (4.0, 4, 4.5)
    assert math.isclose(verdict.rise, 0.125) and verdict.final_accuracy == 0.18 and verdict.unigram == UNIGRAM
    assert verdict.cause == UNKNOWN  # no noise warning, no explosion, above the unigram baseline
    assert "plan=auto plan.client_updates=15000" in verdict.fix and "optimizer.lr=0.5" in verdict.fix
    assert "cohort_size=200" in verdict.fix


def test_a_rising_loss_needs_three_evaluations():
    assert degradation(_history((4.0, 0.20), (4.5, 0.18)), UNIGRAM, V) is None  # two: a start, not a rise


def test_an_exploding_loss_is_an_unstable_step_unless_the_noise_was_warned():
    history = _history((10.7, 0.008), (107.5, 0.001), (342.1, 0.0))
    verdict = degradation(history, UNIGRAM, V, cohort_size=8, rounds=6, server_lr=300.0)
    assert verdict.reasons == ("loss rose", "below unigram", "diverged") and verdict.cause == UNSTABLE
    assert verdict.fix.startswith("a smaller server step (optimizer.lr=150)") and "client_updates=400" in verdict.fix
    noisy = degradation(history, UNIGRAM, V, noise_warned=True, cohort_size=8, rounds=6)
    assert noisy.cause == NOISE
    assert "cohort_size=16" in noisy.fix
    assert "mechanism=bandmf sampling=balls_in_bins privacy.accountant=mc" in noisy.fix
    single = degradation(_history((88.0, 0.03)), UNIGRAM, V)  # one evaluation: (b) and (c) only
    assert single.reasons == ("below unigram", "diverged") and single.cause == UNSTABLE
    nan = degradation(_history((5.0, 0.12), (float("nan"), 0.0)), None, V)
    assert nan.reasons == ("diverged",) and nan.cause == UNSTABLE and nan.best_loss == 5.0


def test_flat_below_the_unigram_baseline_is_too_few_steps():
    verdict = degradation(_history((5.70, 0.01), (5.68, 0.02), (5.66, 0.03)), UNIGRAM, V, cohort_size=8, rounds=6)
    assert verdict.reasons == ("below unigram",) and verdict.cause == TOO_FEW
    assert "plan=auto plan.client_updates=400" in verdict.fix and "rounds=12" in verdict.fix
    # an untrained model sits at about ln V: just past it is not an explosion
    near = degradation(_history((5.73, 0.01)), UNIGRAM, V, cohort_size=8, rounds=2)
    assert near.reasons == ("below unigram", "diverged") and near.cause == TOO_FEW
    assert degradation(_history((5.0, 0.01)), None, V) is None  # no baseline known: (b) is not checked


def test_subword_runs_compare_word_accuracy_with_the_baseline():
    rows = _history((4.0, 0.30))
    rows[-1]["test_word_accuracy"] = 0.05  # the baseline is a next-word accuracy
    assert degradation(rows, UNIGRAM, V).reasons == ("below unigram",)


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


def test_a_run_that_degrades_warns_once_at_its_end_and_says_so_in_summary(run_cli, tmp_path):
    # a huge server step with almost no noise (a small: the pre-run line does not warn): the test
    # loss explodes past ln V (8.2 at round 2, 91 at round 6)
    res = run_cli("+experiment=smoke", "rounds=6", "eval_every=2", "optimizer.lr=300", "privacy.target_epsilon=null",
                  "privacy.noise_multiplier=0.001", "progress=false", f"run_dir={tmp_path / 'bad'}")
    assert res.returncode == 0, res.stderr
    lines = _warnings(res.stderr)
    assert len(lines) == 1 and lines[0].startswith("warning: the model degraded"), res.stderr
    assert "likely cause: unstable step" in lines[0] and "optimizer.lr=150" in lines[0], lines
    summary = json.loads((tmp_path / "bad" / "summary.json").read_text())
    assert summary["degraded"] is True and summary["degradation"]["cause"] == "unstable step"
    assert summary["degradation"]["best_round"] == 2 and summary["degradation"]["final_loss"] > math.log(V)


def test_a_run_that_learns_does_not_warn(run_cli, tmp_path):
    # learns past the unigram baseline (0.107) with a falling test loss: 0.128 at round 20
    res = run_cli("+experiment=smoke", "rounds=20", "eval_every=5", "cohort_size=16", "ema_decay=0",
                  "progress=false", f"run_dir={tmp_path / 'good'}")
    assert res.returncode == 0, res.stderr
    assert [line for line in _warnings(res.stderr) if "degraded" in line] == [], res.stderr
    summary = json.loads((tmp_path / "good" / "summary.json").read_text())
    assert summary["degraded"] is False and "degradation" not in summary


def test_the_fix_suggests_a_plan_the_planner_accepts():
    """plan=auto is suggested with at least the budget it accepts, with population=N where the run
    has no public population, and not to a run that was planned (a review finding)."""
    from fedpriv.degradation import MIN_PLANNED_UPDATES, _fix

    assert "plan=auto plan.client_updates=400" in _fix("too few steps", 8, 3, 1.0, False, True)
    assert MIN_PLANNED_UPDATES == 400
    assert "population=N" in _fix("noise", 100, 150, 1.0, False, False)
    assert "plan=auto" not in _fix("noise", 8, 50, 0.05, True, True)
    assert _fix("too few steps", 8, 50, 0.05, True, True).startswith("more server steps")
