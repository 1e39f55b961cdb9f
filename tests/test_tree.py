"""DP-FTRL tree aggregation: known-answer epsilons and RMSE, sensitivity DP, matrix form, state."""

import json

import dp_accounting
import pytest
import torch

from fedpriv.accounting import calibrate_noise_multiplier, compute_epsilon
from fedpriv.accounting.__main__ import main as accounting_main
from fedpriv.accounting.tree import brute_force_sensitivity_sq, max_sensitivity_sq, tree_event
from fedpriv.errors import ConfigError
from fedpriv.mechanisms import TreeMechanism, build_mechanism
from fedpriv.mechanisms.__main__ import main as mechanisms_main
from fedpriv.mechanisms.tree import node_variances
from fedpriv.optim.server import ServerFTRL, ServerSGD
from fedpriv.sampling import CyclicSampler, PoissonSampler
from fedpriv.randomness import NoiseStream, key_from_seed

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
    mech = TreeMechanism(1.7, 0.5, noise=NoiseStream.from_seed(3), estimator=estimator, restart_every=restart)
    online = torch.stack([mech.noise(t, (d,)) for t in range(n)]).double()
    matrix = mech.matrix(n)
    stream = NoiseStream.from_seed(3)  # the same stream, read in draw order
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
    a = TreeMechanism(2.0, 1.0, noise=NoiseStream.from_seed(7), restart_every=6)
    full = [a.noise(t, (4,)) for t in range(11)]
    b = TreeMechanism(2.0, 1.0, noise=NoiseStream.from_seed(7), restart_every=6)
    head = [b.noise(t, (4,)) for t in range(5)]
    state = b.state_dict()
    # a resumed run rebuilds its streams from the run key (checkpointed beside the mechanism); the
    # mechanism's state is the stream position and the tree's online state
    c = TreeMechanism(2.0, 1.0, noise=NoiseStream.from_seed(7), restart_every=6)
    assert not torch.equal(c.noise(0, (4,)), full[5])
    c = TreeMechanism(2.0, 1.0, noise=NoiseStream.from_seed(7), restart_every=6)
    c.load_state_dict(state)
    tail = [c.noise(t, (4,)) for t in range(5, 11)]
    torch.testing.assert_close(torch.stack(head + tail), torch.stack(full), rtol=0, atol=0)
    with pytest.raises(ValueError, match="round order"):
        c.noise(3, (4,))


def test_build_mechanism_validates():
    assert isinstance(build_mechanism({"name": "tree", "estimator": "plain"}, 1.0, 1.0), TreeMechanism)
    with pytest.raises(ConfigError, match="estimator"):
        build_mechanism({"name": "tree", "estimator": "best"}, 1.0, 1.0)
    with pytest.raises(ConfigError, match="unknown mechanism"):
        build_mechanism({"name": "laplace"}, 1.0, 1.0)


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
