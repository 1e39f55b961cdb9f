"""DP-FTRL tree aggregation: known-answer epsilons and RMSE, sensitivity DP, matrix form, state."""

import json
import math

import dp_accounting
import pytest
import torch

from fedpriv.accounting import calibrate_noise_multiplier, compute_epsilon
from fedpriv.accounting.__main__ import main as accounting_main
from fedpriv.accounting.tree import max_sensitivity_sq, per_level_bound
from fedpriv.errors import ConfigError
from fedpriv.mechanisms import TreeMechanism
from fedpriv.schema import load
from fedpriv.mechanisms.__main__ import main as mechanisms_main
from fedpriv.mechanisms.tree import node_variances
from fedpriv.optim.server import ServerFTRL, ServerSGD
from fedpriv.sampling import CyclicSampler, PoissonSampler
from fedpriv.keys.research_key import key_from_seed, noise_from_seed
from tests.helpers import brute_force_sensitivity_sq, tree_event

ZERO_OUT = dp_accounting.NeighboringRelation.REPLACE_SPECIAL


def _cli(main, args, capsys):
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("sigma,expected", [(8.83, 1.773), (1.13, 18.71)])
def test_single_epoch_tree_known_answers_through_cli(sigma, expected, capsys):
    out = _cli(accounting_main, ["epsilon", "--mechanism", "tree", "--noise-multiplier", str(sigma),
                                 "--rounds", "1600", "--delta", "1e-6", "--json"], capsys)
    assert out["epsilon"] == pytest.approx(expected, abs=0.02 if expected > 10 else 0.005)
    assert out["neighboring_relation"] == "zero_out" and out["accountant"] == "rdp"


@pytest.mark.parametrize("target,sigma", [(1.77, 8.844), (18.71, 1.130)])
def test_tree_noise_calibration_known_answers(target, sigma, capsys):
    out = _cli(accounting_main, ["noise", "--mechanism", "tree", "--target-epsilon", str(target),
                                 "--rounds", "1600", "--delta", "1e-6", "--json"], capsys)
    assert out["noise_multiplier"] == pytest.approx(sigma, rel=0.003)
    assert out["epsilon"] <= target


def test_tree_refuses_poisson_sampling_and_pld():
    with pytest.raises(SystemExit) as exit_info:
        accounting_main(["epsilon", "--mechanism", "tree", "--noise-multiplier", "2", "--rounds", "10",
                         "--delta", "1e-6", "--sampling", "poisson", "--sampling-rate", "0.1"])
    assert exit_info.value.code == 2
    with pytest.raises(ConfigError, match="cyclic"):
        TreeMechanism(1.0, 1.0).dp_event(PoissonSampler(100, 0.1, key_from_seed(0)), 10)
    with pytest.raises(ConfigError, match="pld"):
        compute_epsilon(tree_event(8.83, 1600, 1, 5000), 1e-6, "pld", ZERO_OUT)


@pytest.mark.parametrize("k,s,n,expected", [(1, 7, 8, 4), (3, 3, 9, 11), (2, 0, 8, 14), (2, 0, 9, 14),
                                            (2, 0, 16, 18), (2, 0, 1600, 2 + 4 * 10)])
def test_multi_participation_sensitivity_known_answers(k, s, n, expected):
    assert max_sensitivity_sq(k, s, n) == expected


def test_sensitivity_dynamic_program_equals_brute_force():
    for n in range(1, 13):
        for k in range(1, 4):
            for s in range(0, 5):
                if (k - 1) * (s + 1) + 1 <= n:
                    assert max_sensitivity_sq(k, s, n) == brute_force_sensitivity_sq(k, s, n), (k, s, n)


def test_multi_participation_event_is_gaussian_of_total_sensitivity():
    sampler = CyclicSampler(population=1000, cohort=100, key=key_from_seed(0))  # 10 blocks: every 10th round
    event = TreeMechanism(3.0, 1.0).dp_event(sampler, 25)
    sens_sq = max_sensitivity_sq(3, 9, 25)
    assert event == dp_accounting.GaussianDpEvent(3.0 / sens_sq ** 0.5)
    assert sampler.max_participations(25) == 3 and sampler.min_separation == 9
    single = TreeMechanism(3.0, 1.0).dp_event(sampler, 10)
    assert single == dp_accounting.SingleEpochTreeAggregationDpEvent(3.0, 10)


@pytest.mark.parametrize("mechanism,expected", [("gaussian", 8.031), ("tree", 5.297)])
def test_rmse_known_answers_through_cli(mechanism, expected, capsys):
    out = _cli(mechanisms_main, ["rmse", "--mechanism", mechanism, "--rounds", "128", "--json"], capsys)
    assert out["rmse"] == pytest.approx(expected, abs=0.002)


def test_efficient_estimator_beats_plain_tree(capsys):
    plain = _cli(mechanisms_main, ["rmse", "--mechanism", "tree", "--rounds", "128", "--json"], capsys)["rmse"]
    eff = _cli(mechanisms_main, ["rmse", "--mechanism", "tree-efficient", "--rounds", "128", "--json"],
               capsys)["rmse"]
    assert eff < 0.9 * plain


@pytest.mark.parametrize("estimator", ["plain", "efficient"])
@pytest.mark.parametrize("restart", [None, 5])
def test_online_noise_equals_explicit_matrix_form(estimator, restart):
    n, d = 13, 6
    mech = TreeMechanism(1.7, 0.5, noise=noise_from_seed(3), estimator=estimator, restart_every=restart)
    online = torch.stack([mech.noise(t, (d,)) for t in range(n)]).double()
    matrix = mech.matrix(n)
    stream = noise_from_seed(3)  # the same stream, read in draw order
    draws = torch.stack([stream.normal((d,)) * 1.7 * 0.5 for _ in range(matrix.shape[1])]).double()
    torch.testing.assert_close(online, matrix @ draws, rtol=1e-5, atol=1e-5)


def test_prefix_noise_variance_is_the_tiling_of_node_variances():
    n = 16
    for estimator in ("plain", "efficient"):
        prefix = torch.cumsum(TreeMechanism(1.0, 1.0, estimator=estimator).matrix(n), 0)
        var = node_variances(4, estimator)
        for t in range(1, n + 1):
            heights = [h for h in range(5) if t >> h & 1]
            assert float(prefix[t - 1].pow(2).sum()) == pytest.approx(sum(var[h] for h in heights))
    assert node_variances(3, "efficient")[1] == pytest.approx(1 / (1 + 1 / 2))


def test_resumed_tree_continues_the_same_noise():
    a = TreeMechanism(2.0, 1.0, noise=noise_from_seed(7), restart_every=6)
    full = [a.noise(t, (4,)) for t in range(11)]
    b = TreeMechanism(2.0, 1.0, noise=noise_from_seed(7), restart_every=6)
    head = [b.noise(t, (4,)) for t in range(5)]
    state = b.state_dict()
    # a resumed run rebuilds its streams from the run key (checkpointed beside the mechanism); the
    # mechanism's state is the stream position and the tree's online state
    c = TreeMechanism(2.0, 1.0, noise=noise_from_seed(7), restart_every=6)
    assert not torch.equal(c.noise(0, (4,)), full[5])
    c = TreeMechanism(2.0, 1.0, noise=noise_from_seed(7), restart_every=6)
    c.load_state_dict(state)
    tail = [c.noise(t, (4,)) for t in range(5, 11)]
    torch.testing.assert_close(torch.stack(head + tail), torch.stack(full), rtol=0, atol=0)
    with pytest.raises(ValueError, match="round order"):
        c.noise(3, (4,))


def test_the_mechanism_option_validates_and_builds():
    assert isinstance(load("mechanism", {"name": "tree", "estimator": "plain"}).build(1.0, 1.0), TreeMechanism)
    with pytest.raises(ConfigError, match="estimator"):
        load("mechanism", {"name": "tree", "estimator": "best"})
    with pytest.raises(ConfigError, match="unknown mechanism"):
        load("mechanism", {"name": "laplace"})


def test_ftrl_without_momentum_is_sgd_on_the_stream():
    ftrl, sgd = ServerFTRL(lr=0.3), ServerSGD(lr=0.3)
    theta_f = theta_s = torch.zeros(5)
    gen = torch.Generator().manual_seed(0)
    for _ in range(6):
        update = torch.randn(5, generator=gen)
        theta_f, theta_s = ftrl.step(theta_f, update), sgd.step(theta_s, update)
    torch.testing.assert_close(theta_f, theta_s)


def test_tree_calibration_is_monotone_and_bounded():
    sampler = CyclicSampler(population=400, cohort=40, key=key_from_seed(0))
    mech = TreeMechanism(1.0, 1.0)
    sigma = calibrate_noise_multiplier(lambda s: mech.dp_event(sampler, 30, noise_multiplier=s), 4.0, 1e-5,
                                       "rdp", ZERO_OUT)
    assert compute_epsilon(mech.dp_event(sampler, 30, noise_multiplier=sigma), 1e-5, "rdp", ZERO_OUT) <= 4.0


def test_cli_simulate_tree_smoke(run_cli, tmp_path):
    proc = run_cli("+experiment=smoke", "mechanism=tree", "sampling=cyclic", "optimizer=ftrl", "progress=false",
                   f"run_dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr
    assert "zero_out" in proc.stdout
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert privacy["mechanism"] == "tree" and privacy["neighboring_relation"] == "zero_out"
    bad = run_cli("+experiment=smoke", "mechanism=tree", "sampling=poisson", f"run_dir={tmp_path / 'bad'}")
    assert bad.returncode == 2 and "sampling=cyclic" in bad.stderr


@pytest.mark.parametrize("mechanism,expected", [("gaussian", "poisson"), ("tree", "cyclic"),
                                                ("bandmf", "cyclic_poisson")])
def test_sampling_auto_picks_the_mechanisms_accountable_sampler(tmp_path, mechanism, expected):
    from fedpriv.runner import prepare
    from tests.conftest import compose_cfg

    cfg = compose_cfg("+experiment=smoke", f"mechanism={mechanism}", "mechanism.bands=2", "cohort_size=4",
                      run_dir=tmp_path / "r") if mechanism == "bandmf" else \
        compose_cfg("+experiment=smoke", f"mechanism={mechanism}", run_dir=tmp_path / "r")
    assert cfg["sampling"] == "auto"
    session = prepare(cfg)
    assert session.cfg["sampling"] == expected and session.server.sampler.kind == expected


# ---------------------------------------------------------------- production sizes (issue 13, finding 10)

def test_gboard_es_es_tree_guarantee(capsys):
    """Google's published es-ES tree DP-FTRL: σ 7.0, ≤ 6 participations ≥ 313 rounds apart, 2000
    rounds, δ 1e-10 → Σ sens² 79, ρ = 79/(2·7²) = 0.81 zCDP, ε 8.90."""
    out = _cli(accounting_main, ["epsilon", "--mechanism", "tree", "--noise-multiplier", "7.0", "--rounds", "2000",
                                 "--participations", "6", "--min-separation", "313", "--delta", "1e-10", "--json"],
               capsys)
    assert out["epsilon"] == pytest.approx(8.90, abs=0.05)
    (tree,) = out["tree_sensitivity"]
    assert tree["sum_sensitivity_sq"] == 79 and tree["method"] == "exact"
    assert 79 / (2 * 7.0 ** 2) == pytest.approx(0.81, abs=0.005)


def test_dynamic_program_equals_brute_force_on_more_cases():
    for n in range(13, 18):
        for k in range(2, 5):
            for s in (0, 1, 3, 5):
                if (k - 1) * (s + 1) + 1 <= n:
                    assert max_sensitivity_sq(k, s, n) == brute_force_sensitivity_sq(k, s, n), (k, s, n)


def test_per_level_bound_is_an_upper_bound_and_exact_for_one_participation():
    for n in range(1, 15):
        for k in range(1, 4):
            for s in range(0, 5):
                if (k - 1) * (s + 1) + 1 <= n:
                    exact = brute_force_sensitivity_sq(k, s, n)
                    assert per_level_bound(k, s, n) >= exact, (k, s, n)
                    if k == 1:
                        assert per_level_bound(k, s, n) == exact
    assert per_level_bound(6, 313, 2000) >= 79


def test_prefix_bound_from_the_planned_run_is_an_upper_bound():
    """Per-round epsilon of a run of T rounds bounds a prefix of n rounds by min(exact(T), per-level(n))."""
    for total in (12, 16):
        for n in range(4, total):
            for k, s in ((3, 1), (4, 2)):
                k_n = min(k, -(-n // (s + 1)))
                if (k_n - 1) * (s + 1) + 1 > n or k_n < 2:
                    continue
                event = tree_event(1.0, n, k_n, s, planned_rounds=total, planned_participations=k)
                bounded = 1.0 / event.noise_multiplier ** 2
                assert bounded >= brute_force_sensitivity_sq(k_n, s, n) - 1e-9, (total, n, k, s)


def test_too_costly_exact_program_falls_back_to_the_labelled_bound(capsys, monkeypatch):
    import fedpriv.accounting.tree as tree

    tree.tree_sensitivity.cache_clear()
    monkeypatch.setattr(tree, "EXACT_WORK_LIMIT", 1e3)
    try:
        out = _cli(accounting_main, ["epsilon", "--mechanism", "tree", "--noise-multiplier", "7.0", "--rounds",
                                     "2000", "--participations", "6", "--min-separation", "313", "--delta", "1e-10",
                                     "--json"], capsys)
        (found,) = out["tree_sensitivity"]
        assert found["method"] == "per-level bound" and found["sum_sensitivity_sq"] == per_level_bound(6, 313, 2000)
        assert out["epsilon"] > 8.90  # conservative
        with pytest.raises(ConfigError, match="limit"):
            max_sensitivity_sq(6, 313, 2000)
    finally:
        tree.tree_sensitivity.cache_clear()


def test_the_ledger_runs_the_dynamic_program_once_per_run(monkeypatch):
    """Finding 10: the ledger recomputed the worst case for every round count."""
    import fedpriv.accounting.tree as tree
    from fedpriv.accounting import PrivacyLedger

    calls = []
    real = tree._exact
    monkeypatch.setattr(tree, "_exact", lambda k, s, n: calls.append((k, s, n)) or real(k, s, n))
    tree.tree_sensitivity.cache_clear()
    sampler = CyclicSampler(population=1000, cohort=100, key=key_from_seed(0))  # 10 blocks: k = 6 in 60 rounds
    mech = TreeMechanism(2.0, 1.0, rounds=60)
    ledger = PrivacyLedger(mech, sampler, 1e-5, planned_rounds=60)
    ledger.check_can_run(60)
    epsilons = [ledger.record_round(r) for r in range(60)]
    assert calls == [(6, 9, 60)]
    assert epsilons == sorted(epsilons) and epsilons[-1] == ledger.epsilon(60)
    assert ledger.to_dict()["tree_sensitivity"][0]["method"] == "exact"
    tree.tree_sensitivity.cache_clear()


def test_production_cli_queries_are_bounded(capsys):
    """The issue's cliffs: cyclic 10000/150 over 1000 rounds, 10000/100 over 5000, and 50
    participations 1000 apart over 100000 rounds (answered by the labelled bound)."""
    for args in (["--rounds", "1000", "--population", "10000", "--cohort", "150"],
                 ["--rounds", "5000", "--population", "10000", "--cohort", "100"],
                 ["--rounds", "100000", "--participations", "50", "--min-separation", "1000"]):
        out = _cli(accounting_main, ["epsilon", "--mechanism", "tree", "--noise-multiplier", "20", "--delta", "1e-5",
                                     *args, "--json"], capsys)
        assert math.isfinite(out["epsilon"]) and out["tree_sensitivity"][0]["method"] in ("exact", "per-level bound")
