"""Tests for fedpriv.accounting: pinned known answers, calibration, ledger, CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from fedpriv.release.run_outputs import write_privacy
from fedpriv.accounting import (PLD, PLD_VALUE_DISCRETIZATION, RDP, PrivacyLedger, calibrate_noise_multiplier,
                                compute_epsilon)
from fedpriv.accounting.__main__ import main as cli_main
from fedpriv.errors import ConfigError, PrivacyBudgetExceeded
from fedpriv.mechanisms.gaussian import GaussianMechanism
from fedpriv.sampling import FixedSizeSampler, PoissonSampler
from fedpriv.keys.research_key import key_from_seed
from tests.warm_launcher import run_module

REPO = Path(__file__).resolve().parents[1]
ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE

# KNOWN_ANSWERS.md: DP-SGD, N=60000, batch 256, sigma=1.1, 14063 steps, delta=1e-5, Poisson.
SGD_Q, SGD_SIGMA, SGD_STEPS, SGD_DELTA = 256 / 60000, 1.1, 14063, 1e-5
# KNOWN_ANSWERS.md: DP-FedAvg user level, 342477 users, q=100/342477, 1600 rounds, m=8.83, delta=1e-6.
FEDAVG_N, FEDAVG_Q, FEDAVG_SIGMA, FEDAVG_ROUNDS, FEDAVG_DELTA = 342477, 100 / 342477, 8.83, 1600, 1e-6


def _poisson(rate: float, population: int = 60000) -> PoissonSampler:
    return PoissonSampler(population=population, rate=rate, key=key_from_seed(0))


def _eps(sigma: float, sampler, rounds: int, delta: float, accountant: str = RDP) -> float:
    mech = GaussianMechanism(sigma, clip_norm=1.0)
    return compute_epsilon(mech.dp_event(sampler, rounds), delta, accountant, mech.neighboring_relation(sampler))


# ------------------------------------------------------------------ pinned values

def test_dp_sgd_rdp_known_answer():
    assert _eps(SGD_SIGMA, _poisson(SGD_Q), SGD_STEPS, SGD_DELTA, RDP) == pytest.approx(2.597, abs=0.01)


def test_dp_sgd_pld_known_answer():
    assert _eps(SGD_SIGMA, _poisson(SGD_Q), SGD_STEPS, SGD_DELTA, PLD) == pytest.approx(2.382, abs=0.02)


def test_dp_fedavg_user_level_rdp_known_answer():
    eps = _eps(FEDAVG_SIGMA, _poisson(FEDAVG_Q, FEDAVG_N), FEDAVG_ROUNDS, FEDAVG_DELTA, RDP)
    assert eps == pytest.approx(0.0067, abs=0.001)


def test_rdp_and_pld_differ_at_small_q_as_documented():
    sampler = _poisson(FEDAVG_Q, FEDAVG_N)
    assert _eps(1.13, sampler, FEDAVG_ROUNDS, FEDAVG_DELTA, RDP) == pytest.approx(0.52, abs=0.01)
    assert _eps(1.13, sampler, FEDAVG_ROUNDS, FEDAVG_DELTA, PLD) == pytest.approx(0.048, abs=0.002)


# ------------------------------------------------------------------ compute_epsilon behaviour

@pytest.mark.parametrize("accountant", [RDP, PLD])
def test_epsilon_monotone_in_rounds(accountant):
    sampler = _poisson(0.01)
    eps = [_eps(1.0, sampler, t, 1e-5, accountant) for t in (1, 10, 100, 1000)]
    assert all(a < b for a, b in zip(eps, eps[1:])), eps


@pytest.mark.parametrize("accountant", [RDP, PLD])
def test_non_private_event_is_infinite(accountant):
    assert compute_epsilon(dp_accounting.NonPrivateDpEvent(), 1e-5, accountant) == math.inf
    mech = GaussianMechanism(0.0, clip_norm=1.0)
    sampler = _poisson(0.01)
    assert compute_epsilon(mech.dp_event(sampler, 10), 1e-5, accountant) == math.inf


@pytest.mark.parametrize("accountant", [RDP, PLD])
def test_unsupported_event_fails_closed(accountant):
    with pytest.raises(ConfigError, match=accountant):
        compute_epsilon(dp_accounting.UnsupportedDpEvent(), 1e-5, accountant)


@pytest.mark.parametrize("bad", [0.0, 1.0, -1e-5, float("nan")])
def test_bad_delta_rejected(bad):
    with pytest.raises(ConfigError, match="delta"):
        compute_epsilon(dp_accounting.GaussianDpEvent(1.0), bad)


def test_unknown_accountant_rejected():
    with pytest.raises(ConfigError, match="accountant"):
        compute_epsilon(dp_accounting.GaussianDpEvent(1.0), 1e-5, "moments")


# ------------------------------------------------------------------ fixed-size sampling

def test_fixed_size_event_uses_replace_one_and_half_multiplier():
    mech = GaussianMechanism(1.2, clip_norm=1.0)
    sampler = FixedSizeSampler(population=10000, cohort=100, key=key_from_seed(0))
    assert mech.neighboring_relation(sampler) is REPLACE_ONE
    event = mech.dp_event(sampler, 50)
    assert isinstance(event, dp_accounting.SelfComposedDpEvent) and event.count == 50
    inner = event.event
    assert isinstance(inner, dp_accounting.SampledWithoutReplacementDpEvent)
    assert (inner.source_dataset_size, inner.sample_size) == (10000, 100)
    assert inner.event == dp_accounting.GaussianDpEvent(0.6)


def test_fixed_size_costs_more_than_poisson_at_equal_sigma():
    fixed = FixedSizeSampler(population=10000, cohort=100, key=key_from_seed(0))
    poisson = PoissonSampler(population=10000, rate=0.01, key=key_from_seed(0))
    assert _eps(1.2, fixed, 500, 1e-5) > _eps(1.2, poisson, 500, 1e-5)


def test_fixed_size_under_pld_is_config_error():
    mech = GaussianMechanism(1.2, clip_norm=1.0)
    sampler = FixedSizeSampler(population=10000, cohort=100, key=key_from_seed(0))
    with pytest.raises(ConfigError, match="pld accountant.*SampledWithoutReplacement"):
        compute_epsilon(mech.dp_event(sampler, 10), 1e-5, PLD, REPLACE_ONE)
    with pytest.raises(ConfigError, match="gaussian mechanism with fixed sampling"):
        PrivacyLedger(mech, sampler, delta=1e-5, accountant=PLD)


def test_fixed_size_under_wrong_relation_is_config_error():
    mech = GaussianMechanism(1.2, clip_norm=1.0)
    sampler = FixedSizeSampler(population=10000, cohort=100, key=key_from_seed(0))
    with pytest.raises(ConfigError, match="add_or_remove_one"):
        compute_epsilon(mech.dp_event(sampler, 10), 1e-5, RDP, ADD_REMOVE)


# ------------------------------------------------------------------ calibration

def _sgd_maker(sampler=None, rounds: int = SGD_STEPS):
    mech = GaussianMechanism(1.0, clip_norm=1.0)
    sampler = sampler or _poisson(SGD_Q)
    return (lambda s: mech.dp_event(sampler, rounds, noise_multiplier=s)), mech.neighboring_relation(sampler)


def test_calibration_inverts_dp_sgd_rdp():
    make_event, relation = _sgd_maker()
    target = compute_epsilon(make_event(SGD_SIGMA), SGD_DELTA, RDP, relation)
    sigma = calibrate_noise_multiplier(make_event, target, SGD_DELTA, RDP, relation)
    assert sigma == pytest.approx(SGD_SIGMA, rel=0.003)
    assert compute_epsilon(make_event(sigma), SGD_DELTA, RDP, relation) <= target


def test_calibration_inverts_pld():
    make_event, relation = _sgd_maker(_poisson(0.01), rounds=1000)
    target = compute_epsilon(make_event(1.07), 1e-5, PLD, relation)
    sigma = calibrate_noise_multiplier(make_event, target, 1e-5, PLD, relation)
    assert sigma == pytest.approx(1.07, rel=0.003)
    assert compute_epsilon(make_event(sigma), 1e-5, PLD, relation) <= target


@pytest.mark.parametrize("target", [0.5, 1.0, 3.0, 8.0])
def test_calibration_is_minimal_and_within_budget(target):
    make_event, relation = _sgd_maker(_poisson(0.02), rounds=300)
    sigma = calibrate_noise_multiplier(make_event, target, 1e-5, RDP, relation, rtol=1e-4)
    assert compute_epsilon(make_event(sigma), 1e-5, RDP, relation) <= target
    assert compute_epsilon(make_event(sigma * (1 - 2e-4)), 1e-5, RDP, relation) > target


def test_calibration_fixed_size_returns_mechanism_sigma():
    sampler = FixedSizeSampler(population=10000, cohort=100, key=key_from_seed(0))
    make_event, relation = _sgd_maker(sampler, rounds=200)
    target = compute_epsilon(make_event(1.5), 1e-5, RDP, relation)
    assert calibrate_noise_multiplier(make_event, target, 1e-5, RDP, relation) == pytest.approx(1.5, rel=0.003)


def test_calibration_unreachable_target_is_config_error():
    make_event, relation = _sgd_maker(_poisson(1.0), rounds=100)  # no amplification: RDP floor
    with pytest.raises(ConfigError, match="unreachable"):
        calibrate_noise_multiplier(make_event, 1e-4, 1e-6, RDP, relation)


def test_calibration_pld_fixed_size_is_config_error():
    make_event, relation = _sgd_maker(FixedSizeSampler(population=1000, cohort=10, key=key_from_seed(0)), rounds=10)
    with pytest.raises(ConfigError):
        calibrate_noise_multiplier(make_event, 1.0, 1e-5, PLD, relation)


def test_calibration_rejects_bad_target():
    make_event, relation = _sgd_maker(rounds=10)
    with pytest.raises(ConfigError, match="epsilon"):
        calibrate_noise_multiplier(make_event, 0.0, 1e-5, RDP, relation)


# ------------------------------------------------------------------ ledger

def _ledger(target: float | None = None, sigma: float = 1.0, accountant: str = RDP,
            planned: int | None = 100) -> PrivacyLedger:
    return PrivacyLedger(GaussianMechanism(sigma, clip_norm=1.0), _poisson(0.01, 5000), delta=1e-5,
                         accountant=accountant, target_epsilon=target, planned_rounds=planned)


@pytest.mark.parametrize("accountant", [RDP, PLD])
def test_ledger_cached_epsilon_equals_direct_computation(accountant):
    ledger = _ledger(accountant=accountant)
    for r in range(3):
        ledger.record_round(r)
    mech, sampler = ledger.mechanism, ledger.sampler
    direct = compute_epsilon(mech.dp_event(sampler, 3), 1e-5, accountant, ADD_REMOVE)
    assert ledger.epsilon() == ledger.epsilon(3)
    # per round the ledger composes one more round (finding 13): RDP is the same arithmetic; PLD
    # composes the same one-round PLD pairwise instead of by one FFT (both pessimistic)
    assert ledger.epsilon() == (direct if accountant == RDP else pytest.approx(direct, rel=1e-8))
    if accountant == RDP:  # the count path of dp_accounting's own API gives the same number
        via_count = RdpAccountant().compose(mech.round_event(sampler), 3).get_epsilon(1e-5)
        assert ledger.epsilon() == pytest.approx(via_count, rel=1e-12)


def test_ledger_refuses_past_budget():
    budget = _ledger().epsilon(50)
    ledger = _ledger(target=budget)
    for r in range(50):
        ledger.check_can_run(ledger.rounds_done + 1)
        ledger.record_round(r)
    assert ledger.epsilon() == pytest.approx(budget, rel=1e-12)
    with pytest.raises(PrivacyBudgetExceeded, match="target"):
        ledger.check_can_run(ledger.rounds_done + 1)
    with pytest.raises(PrivacyBudgetExceeded):
        ledger.check_can_run(ledger.planned_rounds)


def test_ledger_without_target_never_refuses():
    ledger = _ledger(target=None)
    assert ledger.check_can_run(10_000) > 0


def test_ledger_rejects_out_of_order_rounds():
    ledger = _ledger()
    ledger.record_round(3)
    with pytest.raises(ValueError):
        ledger.record_round(3)
    with pytest.raises(ValueError):
        ledger.record_round(-1)


def test_ledger_detects_changed_noise_multiplier():
    ledger = _ledger()
    ledger.mechanism.noise_multiplier = 0.5
    with pytest.raises(ConfigError, match="changed"):
        ledger.epsilon(3)


def test_ledger_state_round_trip():
    ledger = _ledger(target=5.0)
    for r in range(0, 40, 2):
        ledger.record_round(r)
    state = json.loads(json.dumps(ledger.state_dict()))  # checkpoints may be JSON-serialised
    resumed = _ledger(target=5.0)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == ledger.state_dict()
    assert resumed.to_dict() == ledger.to_dict()
    ledger.record_round(41)
    resumed.record_round(41)
    assert resumed.to_dict() == ledger.to_dict()


def test_ledger_load_rejects_other_configuration():
    ledger = _ledger(target=5.0)
    ledger.record_round(0)
    with pytest.raises(ConfigError, match="noise_multiplier"):
        _ledger(target=5.0, sigma=2.0).load_state_dict(ledger.state_dict())
    with pytest.raises(ConfigError, match="accountant"):
        _ledger(target=5.0, accountant=PLD).load_state_dict(ledger.state_dict())


def _strict_json(text: str) -> dict:
    def reject(const: str):
        raise ValueError(f"non-standard JSON constant {const}")
    return json.loads(text, parse_constant=reject)


def test_privacy_json_is_valid(tmp_path):
    ledger = _ledger(target=5.0)
    for r in range(10):
        ledger.record_round(r)
    written = write_privacy(tmp_path, ledger)
    assert written == tmp_path / "privacy.json"
    data = _strict_json(written.read_text())
    assert data["epsilon"] == pytest.approx(ledger.epsilon()) and data["non_private"] is False
    assert data["delta"] == 1e-5 and data["accountant"] == "rdp" and data["rounds"] == 10
    assert data["neighboring_relation"] == "add_or_remove_one" and data["noise_multiplier"] == 1.0
    # add/remove-one: neighbours differ in the data's count, so it is not written (issue 41, M3)
    assert data["sampling"] == {"kind": "poisson", "rate": 0.01, "expected_cohort": 50.0}
    assert data["target_epsilon"] == 5.0 and data["planned_rounds"] == 100
    assert "PoissonSampledDpEvent" in data["events"][0] and "count=10" in data["events"][0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["privacy.json"]  # no temp file left


def test_privacy_json_non_private(tmp_path):
    ledger = _ledger(sigma=0.0)
    ledger.record_round(0)
    assert ledger.epsilon() == math.inf
    data = _strict_json(write_privacy(tmp_path / "p.json", ledger).read_text())
    assert data["epsilon"] is None and data["non_private"] is True and data["planned_epsilon"] is None


def test_empty_ledger_has_zero_epsilon():
    ledger = _ledger()
    assert ledger.epsilon() == 0.0
    assert _strict_json(json.dumps(ledger.to_dict(), allow_nan=False))["rounds"] == 0


# ------------------------------------------------------------------ CLI

def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return run_module("fedpriv.accounting", *args, cwd=REPO, timeout=120)


def test_cli_dp_sgd_json_rdp_and_pld(capsys):
    common = ["--noise-multiplier", "1.1", "--sampling-rate", repr(SGD_Q), "--rounds", str(SGD_STEPS),
              "--delta", "1e-5", "--json"]
    rdp = _run_cli("epsilon", "--mechanism", "gaussian", *common)
    assert rdp.returncode == 0, rdp.stderr
    out = _strict_json(rdp.stdout.strip())
    assert out["epsilon"] == pytest.approx(2.597, abs=0.01)
    assert (out["accountant"], out["neighboring_relation"], out["delta"]) == ("rdp", "add_or_remove_one", 1e-5)
    assert cli_main(["epsilon", *common, "--accountant", "pld"]) == 0  # in-process: same code path
    assert _strict_json(capsys.readouterr().out)["epsilon"] == pytest.approx(2.382, abs=0.02)


def test_cli_dp_fedavg_json():
    res = _run_cli("epsilon", "--noise-multiplier", "8.83", "--sampling-rate", repr(FEDAVG_Q),
                   "--rounds", "1600", "--delta", "1e-6", "--population", "342477", "--json")
    assert res.returncode == 0, res.stderr
    assert _strict_json(res.stdout.strip())["epsilon"] == pytest.approx(0.0067, abs=0.001)


def test_cli_bad_input_subprocess():
    res = _run_cli("epsilon", "--noise-multiplier", "1", "--sampling-rate", "0.01", "--rounds", "10",
                   "--delta", "1.5")
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "delta" in lines[0]


BASE = ["--sampling-rate", "0.01", "--rounds", "10", "--delta", "1e-5"]


@pytest.mark.parametrize("argv, needle", [
    (["noise", "--target-epsilon", "0", *BASE], "epsilon"),
    (["noise", "--target-epsilon", "-1", *BASE], "epsilon"),
    (["epsilon", "--noise-multiplier", "-1", *BASE], "noise multiplier"),
    (["epsilon", "--noise-multiplier", "1", "--sampling-rate", "0", "--rounds", "10", "--delta", "1e-5"],
     "sampling rate"),
    (["epsilon", "--noise-multiplier", "1", "--sampling-rate", "1.5", "--rounds", "10", "--delta", "1e-5"],
     "sampling rate"),
    (["epsilon", "--noise-multiplier", "1", "--sampling-rate", "0.01", "--rounds", "0", "--delta", "1e-5"], "rounds"),
    (["epsilon", "--noise-multiplier", "1", "--sampling-rate", "0.01", "--rounds", "10", "--delta", "0"], "delta"),
    (["epsilon", "--noise-multiplier", "1", *BASE, "--sampling", "fixed"], "population"),
    (["epsilon", "--noise-multiplier", "1", *BASE, "--sampling", "fixed", "--population", "1000",
      "--accountant", "pld"], "pld accountant"),
    (["epsilon", "--noise-multiplier", "1", *BASE, "--accountant", "moments"], "accountant"),
    (["epsilon", "--noise-multiplier", "1", *BASE, "--mechanism", "nope"], "mechanism"),
    (["epsilon", "--noise-multiplier", "x", *BASE], "noise-multiplier"),
    (["noise", "--target-epsilon", "1e-4", "--sampling-rate", "1", "--rounds", "100", "--delta", "1e-6"],
     "unreachable"),
    ([], "command"),
])
def test_cli_bad_input_one_line_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1, captured.err
    assert lines[0].startswith("error: ") and needle in lines[0]


def test_cli_noise_inverts_epsilon(capsys):
    assert cli_main(["epsilon", "--noise-multiplier", "1.3", *BASE[:2], "--rounds", "500",
                     "--delta", "1e-5", "--json"]) == 0
    eps = json.loads(capsys.readouterr().out)["epsilon"]
    assert cli_main(["noise", "--target-epsilon", repr(eps), *BASE[:2], "--rounds", "500",
                     "--delta", "1e-5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["noise_multiplier"] == pytest.approx(1.3, rel=0.003)
    assert out["epsilon"] <= eps and out["accountant"] == "rdp"


def test_cli_fixed_size_and_human_output(capsys):
    assert cli_main(["epsilon", "--noise-multiplier", "1.2", *BASE, "--sampling", "fixed",
                     "--population", "10000"]) == 0
    line = capsys.readouterr().out.strip()
    assert "replace_one" in line and "rdp" in line and line.startswith("epsilon = ")
    expected = _eps(1.2, FixedSizeSampler(population=10000, cohort=100, key=key_from_seed(0)), 10, 1e-5)
    assert cli_main(["epsilon", "--noise-multiplier", "1.2", *BASE, "--sampling", "fixed",
                     "--population", "10000", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["epsilon"] == pytest.approx(expected, rel=1e-12)


def test_cli_non_private_json(capsys):
    assert cli_main(["epsilon", "--noise-multiplier", "0", *BASE, "--json"]) == 0
    out = _strict_json(capsys.readouterr().out)
    assert out["epsilon"] is None and out["non_private"] is True


# ---------------------------------------------------------------- bounded cost (issue 13, finding 13)

@pytest.mark.parametrize("accountant", [RDP, PLD])
def test_self_composition_equals_the_full_computation(accountant):
    from fedpriv.accounting.accountant import SelfComposition

    inner = dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.1))
    curve = SelfComposition(inner, 1e-5, accountant, ADD_REMOVE)
    for n in (1, 2, 3, 40, 41, 90):
        full = compute_epsilon(dp_accounting.SelfComposedDpEvent(inner, n), 1e-5, accountant, ADD_REMOVE)
        assert curve.epsilon(n) == pytest.approx(full, rel=1e-12 if accountant == RDP else 1e-7)


def test_ledger_does_not_recompose_the_run_every_round(monkeypatch):
    """Per-round epsilon used to recompute the whole PLD composition (~10 s a round at smoke scale)."""
    import fedpriv.accounting.accountant as accountant_module
    import fedpriv.accounting.ledger as ledger_module

    full = []
    real = accountant_module.compute_epsilon
    monkeypatch.setattr(ledger_module, "compute_epsilon", lambda *a, **k: full.append(a) or real(*a, **k))
    ledger = _ledger(accountant=PLD)
    for r in range(30):
        ledger.record_round(r)
    assert full == []  # every round went through the one-round composition
    assert ledger.epsilon() == pytest.approx(compute_epsilon(ledger.dp_event(), 1e-5, PLD, ADD_REMOVE), rel=1e-7)


def test_pld_calibration_needs_few_fine_evaluations(monkeypatch):
    """Every search step was a fine PLD before (8 fine evaluations for this event; the smoke experiment's
    prepare took 47 s with PLD, measured on the old code): now coarse passes, then at most 4 fine ones."""
    import fedpriv.accounting.accountant as accountant_module

    fine = []
    real = accountant_module.compute_epsilon

    def counted(event, delta, accountant=RDP, relation=ADD_REMOVE, discretization=PLD_VALUE_DISCRETIZATION):
        if discretization == PLD_VALUE_DISCRETIZATION:
            fine.append(event)
        return real(event, delta, accountant, relation, discretization)

    monkeypatch.setattr(accountant_module, "compute_epsilon", counted)
    make = lambda s: dp_accounting.SelfComposedDpEvent(  # noqa: E731 - the default experiment's event
        dp_accounting.PoissonSampledDpEvent(150 / 10000, dp_accounting.GaussianDpEvent(s)), 220)
    sigma = calibrate_noise_multiplier(make, 8.0, 1e-5, PLD)
    assert len(fine) <= 4
    assert real(make(sigma), 1e-5, PLD) <= 8.0 < real(make(sigma * (1 - 2e-4)), 1e-5, PLD)


def test_pld_refuses_up_front_when_its_grid_would_not_fit(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["epsilon", "--accountant", "pld", "--sampling-rate", "1", "--noise-multiplier", "0.1",
                  "--rounds", "1000", "--delta", "1e-5"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "limit 2 GB" in err[0] and "rdp" in err[0]


def test_budget_check_agrees_with_calibration_to_the_last_bit():
    """The planned run's epsilon, checked before round 1, is the number calibration computed."""
    sampler = _poisson(0.05, 2000)
    for accountant in (RDP, PLD):
        mech = GaussianMechanism(1.0, clip_norm=1.0)
        make = lambda s, mech=mech: mech.dp_event(sampler, 300, noise_multiplier=s)  # noqa: E731
        mech.noise_multiplier = calibrate_noise_multiplier(make, 0.5 if accountant == PLD else 2.0, 1e-5, accountant)
        ledger = PrivacyLedger(mech, sampler, 1e-5, accountant=accountant, target_epsilon=0.5 if accountant == PLD
                               else 2.0, planned_rounds=300)
        assert ledger.check_can_run(300) == compute_epsilon(mech.dp_event(sampler, 300), 1e-5, accountant, ADD_REMOVE)


def test_pld_ledger_refuses_up_front_too():
    """A fixed small noise multiplier with PLD (no calibration) over many rounds is refused with the limit
    (~6 GB asked), not run out of memory. (σ = 0.1 over 1,000 rounds asked the same refusal, but the
    ledger's own one-round check composed a 3.8-million-point PLD first: 9 s; σ = 0.5 takes under 1 s.)"""
    with pytest.raises(ConfigError, match="limit 2 GB"):
        PrivacyLedger(GaussianMechanism(0.5, clip_norm=1.0), _poisson(1.0, 100), 1e-5, accountant=PLD,
                      planned_rounds=100_000).check_can_run(100_000)


def test_a_nan_in_the_ledger_is_never_published(tmp_path, monkeypatch):
    """privacy.json never states "nan" as a guarantee: the write is refused."""
    ledger = _ledger()
    monkeypatch.setattr(ledger, "to_dict", lambda: {"epsilon": float("nan"), "non_private": False})
    with pytest.raises(ValueError, match="NaN"):
        write_privacy(tmp_path, ledger)
    assert not (tmp_path / "privacy.json").exists()


def test_the_accountants_import_without_torch():
    """Issue 41 (edge 7): the accountants (rdp, pld, and the Monte-Carlo one until it samples) and
    the package's names load without torch; torch is imported on the Monte-Carlo sampling path only."""
    code = ("import sys, dp_accounting\n"
            "from fedpriv.accounting import RDP, compute_epsilon, relation_name\n"
            "from fedpriv.accounting.monte_carlo import BallsInBinsDpEvent, MonteCarloSettings\n"
            "eps = compute_epsilon(dp_accounting.GaussianDpEvent(1.0), 1e-5, RDP)\n"
            "print(eps > 0, 'torch' in sys.modules)\n"
            "from fedpriv.accounting.monte_carlo import epsilon\n"
            "epsilon(BallsInBinsDpEvent(1.0, 4, 2, (1.0,)), 1e-2, MonteCarloSettings(samples=2000))\n"
            "print('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "True"]


def test_the_calculators_help_imports_no_torch():
    """Issue 52 (item 11): ``python -m fedpriv.accounting --help`` prints its sub-commands without
    importing torch (the samplers and mechanisms that need it load once a sub-command is parsed)."""
    code = ("import runpy, sys\n"
            "sys.argv = ['fedpriv.accounting', '--help']\n"
            "try:\n"
            "    runpy.run_module('fedpriv.accounting', run_name='__main__', alter_sys=True)\n"
            "except SystemExit as stop:\n"
            "    assert stop.code == 0, stop.code\n"
            "print('torch' in sys.modules, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "{epsilon,noise,delta,ddgauss}" in done.stdout, done.stdout
    assert done.stderr.split() == ["False"], done.stderr



def test_dp_accountings_note_of_an_excluded_rdp_order_is_dropped_and_epsilon_is_unchanged(caplog):
    """Issue 52 (item 10): at q = 0.2 and σ = 1 the RDP series of orders 1.1-1.7 do not converge and
    dp_accounting logs "Excluding this order from the epsilon computation" for each; fedpriv drops
    that note at its source, and the ε is dp_accounting's own (the minimum over the other orders)."""
    import logging

    import numpy as np
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    caplog.set_level(logging.WARNING, logger="absl")  # whatever level another test left on absl's logger
    orders = np.array(rdp.DEFAULT_RDP_ORDERS)
    per_round = rdp._compute_rdp_poisson_subsampled_gaussian(0.2, 1.0, orders)
    assert list(orders[~np.isfinite(per_round)]) == pytest.approx([1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7])
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(1.0)), 3)
    eps = compute_epsilon(event, 1e-3, RDP)
    assert not [r.getMessage() for r in caplog.records if r.name == "absl"]
    assert eps == pytest.approx(float(rdp.compute_epsilon(orders, 3 * per_round, 1e-3)[0]), rel=1e-12)
    logging.getLogger("absl").warning("another warning of dp_accounting")  # kept
    assert [r.getMessage() for r in caplog.records if r.name == "absl"] == ["another warning of dp_accounting"]


# ---------------------------------------------------------------- a negative RDP order (issue 52: fail closed)
# At extreme events dp_accounting's RDP of the Poisson-sampled Gaussian cancels to a *negative*
# value at some orders, and its conversion reads such an order as epsilon 0 (delta 0): the minimum
# over orders is then 0 for a release that is not free.

def _sampled(rate: float, sigma: float, count: int) -> dp_accounting.DpEvent:
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), count)


TINY = (1e-4, 1e6, 1000)  # rate, noise, rounds: 32 of the default orders negative
COUNTED = (1e-6, 1e6, 10 ** 24)  # the cancellation times a count: exact arithmetic gives epsilon >= 4.3 at 1e-5


@pytest.mark.parametrize("rate,sigma,count", [TINY, COUNTED])
def test_a_negative_rdp_order_is_refused_never_read_as_epsilon_zero(rate, sigma, count):
    from fedpriv.accounting.accountant import SelfComposition

    event = _sampled(rate, sigma, count)
    theirs = RdpAccountant().compose(event)
    assert theirs.rdp.min() < 0 and theirs.get_epsilon(1e-5) == 0  # the trigger, as dp_accounting reads it
    with pytest.raises(ConfigError, match=r"below floating-point resolution .*; the pld accountant supports it"):
        compute_epsilon(event, 1e-5, RDP)
    with pytest.raises(ConfigError, match="below floating-point resolution"):  # the ledger's per-round path
        SelfComposition(event.event, 1e-5, RDP, ADD_REMOVE).epsilon(count)
    if count == TINY[2]:  # a run's ledger refuses before round 1
        with pytest.raises(ConfigError, match="below floating-point resolution"):
            PrivacyLedger(GaussianMechanism(sigma, clip_norm=1.0), _poisson(rate, 10 ** 6), delta=1e-5)
    assert compute_epsilon(dp_accounting.NoOpDpEvent(), 1e-5, RDP) == 0.0  # nothing released is still 0
    healthy = _sampled(0.01, 1.0, 1000)
    assert compute_epsilon(healthy, 1e-5, RDP) == RdpAccountant().compose(healthy).get_epsilon(1e-5)


def test_cli_delta_refuses_a_negative_rdp_order(capsys):
    """dp_accounting's delta path read the negative orders of COUNTED as delta 0."""
    rate, sigma, count = COUNTED
    with pytest.raises(SystemExit) as exc:
        cli_main(["delta", "--epsilon", "1", "--noise-multiplier", repr(sigma), "--sampling-rate", repr(rate),
                  "--rounds", str(count), "--json"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1
    assert captured.err.startswith("error: ") and "below floating-point resolution" in captured.err


def test_calibration_never_takes_a_negative_rdp_order_as_fitting():
    """Searching upward, calibration reached sigma ~2.2e5, whose RDP reads as epsilon 0 (exact
    arithmetic: >= 21.7 against the target 1), and returned it; now such a sigma does not fit and
    the search says why it found none."""
    with pytest.raises(ConfigError, match=r"calibrating to target epsilon 1\.0 .*below floating-point resolution"):
        calibrate_noise_multiplier(lambda s: _sampled(1e-4, s, 10 ** 20), 1.0, 1e-5)


def test_calibration_steps_over_an_unresolved_noise_soundly():
    """A sigma inside the bracket whose event cannot be resolved (here: sigma in (1.5, 3) stands for
    an extreme event) is not private enough, never epsilon 0: the answer is a sigma whose epsilon
    was computed within the target."""
    target = compute_epsilon(_sampled(0.01, 4.0, 1000), 1e-5, RDP)

    def make_event(sigma: float) -> dp_accounting.DpEvent:
        return _sampled(*TINY) if 1.5 < sigma < 3.0 else _sampled(0.01, sigma, 1000)

    sigma = calibrate_noise_multiplier(make_event, target, 1e-5)
    assert sigma == pytest.approx(4.0, rel=2e-4) and compute_epsilon(make_event(sigma), 1e-5, RDP) <= target


def test_ddgauss_refuses_a_negative_rdp_order():
    """The distributed discrete Gaussian's own Zhu-Wang bound cancels below zero at tiny rates too;
    it used to convert to epsilon 0."""
    from fedpriv.accounting.ddgauss import DistributedDiscreteGaussian

    ddg = DistributedDiscreteGaussian(clip=1.0, granularity=1e-3, local_std=1.0, shares=100, dim=1024)
    assert ddg.epsilon(1e-5, 100, 1e-2) > 0
    with pytest.raises(ConfigError, match="distributed discrete Gaussian is below floating-point resolution"):
        ddg.epsilon(1e-5, 100, 1e-9)
