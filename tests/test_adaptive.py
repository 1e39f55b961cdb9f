"""DP adaptive server optimizers: zero-noise invariant (exactly Adam / AdaGrad), the IME noise
split and the bias correction as known answers, scale-then-privatize, identical ledgers, CLI."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from fedpriv.round.dpfedavg import DPFedAvg
from fedpriv.round.replies import ClientReplies, ClientUpdate
from fedpriv.errors import ConfigError
from fedpriv.mechanisms import GaussianMechanism
from fedpriv.optim import DPAdaptive, build_server_optimizer
from fedpriv.release.rundir import read_jsonl
from fedpriv.runner import prepare
from fedpriv.sampling import make_sampler
from fedpriv.keys.research_key import key_from_seed, noise_from_seed
from server.app import run_local
from tests.conftest import compose_cfg

DIM = 64
ADAM_VARIANTS = ["dpadam_post", "dpadam_bc", "dpadam_ime", "dpadam_stp", "adam_noiseless_precond"]
ADAGRAD_VARIANTS = ["dpadagrad_post", "dpadagrad_bc", "dpadagrad_ime", "dpadagrad_stp", "adagrad_noiseless_precond"]


def deltas(round_idx: int, users: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + round_idx)
    return [torch.randn(DIM, generator=gen) * 0.1 for _ in range(users)]


def server(name: str, users: int, sigma: float = 0.0, clip: float = 1e6, **kwargs) -> DPFedAvg:
    torch.manual_seed(0)
    params = torch.randn(DIM)
    optimizer = build_server_optimizer(name, lr=0.05, **kwargs)
    sampler = make_sampler("poisson", users, users, key_from_seed(0))  # rate 1: every user, every round
    return DPFedAvg(params, sampler, GaussianMechanism(sigma, clip, noise=noise_from_seed(3)), clip, optimizer)


def run(srv: DPFedAvg, rounds: int, users: int) -> list[dict]:
    out = []
    for r in range(rounds):
        cohort = srv.cohort(r)
        replies = ClientReplies([ClientUpdate(int(u), d) for u, d in zip(cohort, deltas(r, users))])
        out.append(srv.apply_round(r, cohort, replies)[0])
    return out


def reference(kind: str, rounds: int, users: int) -> torch.Tensor:
    """torch.optim's Adam / Adagrad on g_t = −mean(deltas_t)."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(DIM))
    opt = (torch.optim.Adam([p], lr=0.05, betas=(0.9, 0.999), eps=1e-3) if kind == "adam"
           else torch.optim.Adagrad([p], lr=0.05, eps=1e-3))
    for r in range(rounds):
        p.grad = -torch.stack(deltas(r, users)).mean(0)
        opt.step()
    return p.detach()


@pytest.mark.parametrize("name", ADAM_VARIANTS + ADAGRAD_VARIANTS)
def test_zero_noise_and_no_clipping_gives_exactly_adam_or_adagrad(name):
    """σ = 0, a clip no update reaches: every variant is the non-private optimizer. IME's second
    moment is the mean of squared deltas, which equals the squared mean only for one user."""
    users = 1 if "ime" in name else 5
    srv = server(name, users)
    run(srv, 6, users)
    kind = "adam" if "adam" in name else "adagrad"
    torch.testing.assert_close(srv.params, reference(kind, 6, users), rtol=1e-5, atol=1e-6)


def test_ime_noise_split_known_answer():
    """Zero deltas: the update carries noise σC/√(1−ρ)/B, the squares σC²/√ρ/B (ρ = 0.2)."""
    sigma, clip, users = 1.5, 0.5, 4
    srv = server("dpadam_ime", users, sigma=sigma, clip=clip, ime_fraction=0.2)
    seen = {}
    original = srv.optimizer.step_release

    def spy(params, release):
        seen["update"], seen["squares"] = release.update.clone(), release.squares.clone()
        return original(params, release)

    srv.optimizer.step_release = spy
    dim = 200_000
    srv.params = torch.zeros(dim)
    cohort = srv.cohort(0)
    srv.apply_round(0, cohort, ClientReplies([ClientUpdate(int(u), torch.zeros(dim)) for u in cohort]))
    assert float(seen["update"].std()) == pytest.approx(sigma * clip / math.sqrt(0.8) / users, rel=0.01)
    assert float(seen["squares"].std()) == pytest.approx(sigma * clip ** 2 / math.sqrt(0.2) / users, rel=0.01)
    # the split is as private as one Gaussian query with multiplier σ: 1/σ1² + 1/σ2² = 1/σ²
    s1, s2 = sigma / math.sqrt(0.8), sigma / math.sqrt(0.2)
    assert 1 / s1 ** 2 + 1 / s2 ** 2 == pytest.approx(1 / sigma ** 2)


def test_bias_correction_known_answer():
    """Pure noise, round 1: v̂ − (σC/B)² is negative where g² < var, i.e. with P(χ²₁ < 1) = 0.6827."""
    srv = server("dpadam_bc", 4, sigma=2.0, clip=1.0)
    dim = 200_000
    srv.params = torch.zeros(dim)
    cohort = srv.cohort(0)
    stats, _ = srv.apply_round(0, cohort, ClientReplies([ClientUpdate(int(u), torch.zeros(dim)) for u in cohort]))
    assert stats["v_negative_fraction"] == pytest.approx(0.6827, abs=0.005)


def test_scale_then_privatize_scales_before_clipping():
    """Round 2 of stp: each delta is multiplied by s = 1/(√v̂₁ + ε) before the clip, the noisy
    sum is divided by s. Checked against the formula with clipping active and σ = 0."""
    users, clip = 3, 0.05
    srv = server("dpadam_stp", users, clip=clip)
    run(srv, 1, users)
    opt: DPAdaptive = srv.optimizer
    s = opt.client_scale()
    assert s is not None and torch.all(s > 0)
    m, v, params = opt.m.clone(), opt.v.clone(), srv.params.clone()
    stats = run_round_two(srv, users)
    clipped = []
    for d in deltas(1, users):
        scaled = d * s
        clipped.append(scaled * min(1.0, clip / float(scaled.norm())))
    update = torch.stack(clipped).sum(0) / users / s
    g = -update
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    expected = params - 0.05 * (m / (1 - 0.9 ** 2)) / ((v / (1 - 0.999 ** 2)).sqrt() + 1e-3)
    torch.testing.assert_close(srv.params, expected, rtol=1e-5, atol=1e-7)
    assert stats["clipped_fraction"] > 0


def test_stp_rms_normalization_is_a_rescaled_clip():
    """stp_normalize=rms divides s_t by its RMS r: with noise on, the round equals raw STP run
    at clip C·r (and noise σ·C·r) — a scalar on s_t only moves the clip. Round 1 (s = 1) is post."""
    users, clip, sigma = 3, 0.05, 0.7
    normed = server("dpadam_stp", users, sigma=sigma, clip=clip)
    post = server("dpadam_post", users, sigma=sigma, clip=clip)
    run(normed, 1, users)
    run(post, 1, users)
    torch.testing.assert_close(normed.params, post.params, rtol=0, atol=0)
    s = normed.optimizer.client_scale()
    assert float(s.square().mean()) == pytest.approx(1.0, rel=1e-6)
    rescaled = copy.deepcopy(normed)  # same state after round 1, then raw s_t and clip C·r
    rescaled.optimizer.stp_normalize = "none"
    raw_s = rescaled.optimizer.client_scale()
    torch.testing.assert_close(s, raw_s / raw_s.square().mean().sqrt())
    r = float(raw_s.square().mean().sqrt())
    assert r > 100  # raw s ≈ 1/√v̂: a clip meant for unscaled deltas would clip everything
    rescaled.clip_norm = rescaled.mechanism.clip_norm = clip * r
    assert run_round_two(normed, users)["clipped_fraction"] > 0
    run_round_two(rescaled, users)
    torch.testing.assert_close(normed.params, rescaled.params, rtol=1e-4, atol=1e-6)
    with pytest.raises(ConfigError, match="stp_normalize"):
        build_server_optimizer("dpadam_stp", stp_normalize="l2")
    with pytest.raises(ConfigError, match="stp_eps"):
        build_server_optimizer("dpadam_stp", stp_eps=0.0)


def test_stp_eps_sets_the_scale_and_a_large_one_is_post():
    """s_t = 1/(√v̂ + ε_s) with ε_s = stp_eps; ε_s ≫ √v̂ makes s_t uniform, so STP = post."""
    users = 3
    srv = server("dpadam_stp", users, sigma=0.5, clip=0.05, stp_eps=0.01, stp_normalize="none")
    run(srv, 1, users)
    opt = srv.optimizer
    torch.testing.assert_close(opt.client_scale(), 1.0 / ((opt.v / (1 - 0.999)).sqrt() + 0.01))
    flat = server("dpadam_stp", users, sigma=0.5, clip=0.05, stp_eps=1e9)
    post = server("dpadam_post", users, sigma=0.5, clip=0.05)
    run(flat, 3, users)
    run(post, 3, users)
    torch.testing.assert_close(flat.params, post.params)


def run_round_two(srv: DPFedAvg, users: int) -> dict:
    """Round 2's released statistics and diagnostics in one dict."""
    cohort = srv.cohort(1)
    replies = ClientReplies([ClientUpdate(int(u), d) for u, d in zip(cohort, deltas(1, users))])
    released, diagnostics = srv.apply_round(1, cohort, replies, diagnostics=True)
    return {**released, **diagnostics}


@pytest.fixture(scope="module")
def adam_ledger(tmp_path_factory):
    out = tmp_path_factory.mktemp("adam")
    run_local(prepare(compose_cfg("+experiment=smoke", "progress=false", "rounds=2", "optimizer=adam", run_dir=out)))
    return json.loads((out / "privacy.json").read_text())


@pytest.mark.parametrize("name", ADAM_VARIANTS + ADAGRAD_VARIANTS)
def test_every_variant_runs_names_itself_and_keeps_the_ledger(tmp_path, name, adam_ledger):
    session = prepare(compose_cfg("+experiment=smoke", "progress=false", "rounds=2", f"optimizer={name}",
                                  run_dir=tmp_path / "run"))
    summary = run_local(session)
    assert summary["optimizer"] == name
    ledger = json.loads((tmp_path / "run" / "privacy.json").read_text())
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert ("v_negative_fraction" in rows[0]) == ("_bc" in name or "_ime" in name)
    if "noiseless" in name:
        # non-private in every file (finding 4): no finite epsilon in privacy.json, summary.json or
        # any metrics row; the mechanism's own accounting kept only as a labelled field
        for privacy in (ledger, summary["privacy"]):
            assert privacy["non_private"] is True and privacy["epsilon"] is None
            assert "noiseless" in privacy["non_private_reason"]
            assert privacy["accounted_epsilon_of_the_noised_update_only"] == adam_ledger["epsilon"]
        assert ledger["planned_epsilon"] is None
        assert all(r["epsilon"] is None and r["non_private"] is True for r in rows)
        noised = {k: v for k, v in ledger.items()
                  if k not in ("epsilon", "non_private", "planned_epsilon", "non_private_reason",
                               "accounted_epsilon_of_the_noised_update_only")}
        assert noised == {k: v for k, v in adam_ledger.items()
                          if k not in ("epsilon", "non_private", "planned_epsilon")}
    else:
        assert ledger == adam_ledger  # the IME split included
        assert summary["privacy"]["epsilon"] == ledger["epsilon"] < math.inf
        assert all(r["epsilon"] < math.inf and "non_private" not in r for r in rows)


def test_cli_stp_and_noiseless_are_named(run_cli, tmp_path):
    # one round: what is asserted (the optimizer's name, the non-private line) holds from round 1
    proc = run_cli("+experiment=smoke", "rounds=1", "optimizer=dpadam_stp", "progress=false",
                   f"run_dir={tmp_path / 'stp'}")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "stp" / "summary.json").read_text())["optimizer"] == "dpadam_stp"
    proc = run_cli("+experiment=smoke", "rounds=1", "optimizer=adam_noiseless_precond", "progress=false",
                   f"run_dir={tmp_path / 'nl'}")
    assert proc.returncode == 0, proc.stderr
    assert "epsilon inf (non-private: " in proc.stdout and "NOT PRIVATE" in proc.stdout + proc.stderr


@pytest.mark.parametrize("args,message", [
    (("optimizer=dpadam_ime", "mechanism=tree"), "mechanism=gaussian"),
    (("optimizer=dpadagrad_bc", "mechanism=bandmf", "mechanism.bands=2"), "mechanism=gaussian"),
    (("optimizer=dpadam_stp", "algorithm=dp_fedsgd"), "one_pass"),
    (("optimizer=dpadam_post", "optimizer.ime_fraction=1.5"), "ime_fraction"),
])
def test_unsupported_combinations_exit_2(run_cli, tmp_path, args, message):
    proc = run_cli("+experiment=smoke", *args, f"run_dir={tmp_path / 'r'}")
    assert proc.returncode == 2 and message in proc.stderr
    assert not (tmp_path / "r").exists()


def test_query_plan_joint_query_is_the_accounted_gaussian():
    """IME's pair is one Gaussian query with multiplier sigma; a split that is not fails closed."""
    import math

    from fedpriv.errors import ConfigError
    from fedpriv.mechanisms import GaussianMechanism, TreeMechanism
    from fedpriv.round.queries import QueryPlan, joint_noise_multiplier

    for rho in (0.1, 0.5, 0.9):
        assert math.isclose(joint_noise_multiplier(1.7, 1 / math.sqrt(1 - rho), 1 / math.sqrt(rho)), 1.7,
                            rel_tol=1e-12)
    gaussian, tree = GaussianMechanism(1.0, 1.0), TreeMechanism(1.0, 1.0)
    QueryPlan(update_noise_factor=math.sqrt(2), squares_noise_factor=math.sqrt(2)).check("x", gaussian, True)
    with pytest.raises(ConfigError, match="not one Gaussian query"):
        QueryPlan(update_noise_factor=1.0, squares_noise_factor=1.0).check("x", gaussian, True)
    with pytest.raises(ConfigError, match="independent Gaussian noise"):
        QueryPlan(update_noise_factor=math.sqrt(2), squares_noise_factor=math.sqrt(2)).check("x", tree, True)
    with pytest.raises(ConfigError, match="each user's delta"):
        QueryPlan(pre_clip_scale=True).check("x", gaussian, False)
    QueryPlan().check("x", tree, False)  # the default plan: any mechanism, any algorithm
