"""client.precision (fedpriv/precision.py): the modes set torch's float32 switches and autocast for
the clients' steps and restore them; whatever the mode, the DP arithmetic (norms, clip factors,
clipped sums) is IEEE float32, so a clipped example's contribution has norm C to float32 rounding."""

import numpy as np
import pytest
import torch
from torch import nn

from fedpriv.clipping import BookKeeping
from fedpriv.round.cohort_parallel import CohortTrainer
from fedpriv.errors import ConfigError
from fedpriv.round.local_dp import ExampleDP
from fedpriv.models import LSTMLanguageModel, get_flat_params
from fedpriv.precision import _switches, as_fp32, compute_precision, exact_fp32
from fedpriv.schema import Client, load
from fedpriv.round.training import LocalConfig, local_update

from helpers import client_draws

CPU = torch.device("cpu")


def _state() -> list[object]:
    return [getattr(owner, name) for owner, name in _switches()]


def _spy_precision(monkeypatch, owner, name: str) -> list[tuple[bool, list[object]]]:
    """Wrap ``owner.name`` (a function or a method) so that every call first records whether CPU
    autocast is on and the float32 switches' state; returns the list the records go to."""
    seen: list[tuple[bool, list[object]]] = []
    original = getattr(owner, name)

    def noting(*args, **kwargs):
        seen.append((torch.is_autocast_enabled("cpu"), _state()))
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, noting)
    return seen


@pytest.mark.parametrize("mode,expected", [("fp32", "ieee"), ("tf32", "tf32"), ("bf16", "tf32")])
def test_modes_set_the_float32_switches_and_restore_them(mode, expected):
    before = _state()
    with compute_precision(mode, CPU):
        assert all(v in (expected, expected == "tf32") for v in _state())
        assert torch.is_autocast_enabled("cpu") == (mode == "bf16")
        with exact_fp32():  # the DP arithmetic: IEEE, no autocast, inside any mode
            assert all(v in ("ieee", False) for v in _state())
            assert not torch.is_autocast_enabled("cpu")
        assert torch.is_autocast_enabled("cpu") == (mode == "bf16")
    assert _state() == before and not torch.is_autocast_enabled("cpu")
    with pytest.raises(RuntimeError, match="boom"):
        with compute_precision(mode, CPU):
            raise RuntimeError("boom")
    assert _state() == before and not torch.is_autocast_enabled("cpu")


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision must be one of"):
        with compute_precision("fp16", CPU):
            pass
    with pytest.raises(ConfigError, match="client.precision"):
        load(Client, {"precision": "fp16"}, "client")


def test_as_fp32_upcasts_lower_floats_only():
    assert as_fp32(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.float32
    assert as_fp32(torch.ones(2, dtype=torch.float64)).dtype == torch.float64
    assert as_fp32(torch.ones(2, dtype=torch.long)).dtype == torch.long


def clipped_norm_errors(device: torch.device, precision: str) -> list[float]:
    """``|‖clipped gradient‖ / C − 1|`` of six single examples whose gradients are far above C,
    clipped by BK on ``device`` with the forward and backward in ``precision``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.Tanh(), nn.Linear(96, 48)).to(device)
    clip = 0.01
    bk = BookKeeping(model, clip_norm=clip, noise_multiplier=0.0)
    errors = []
    for seed in range(6):
        x = (torch.randn(1, 64, generator=torch.Generator().manual_seed(seed)) * 3).to(device)
        with compute_precision(precision, device):
            out = model(x)
            if precision == "bf16":
                assert out.dtype == torch.bfloat16  # autocast ran the forward in bfloat16
            bk.backward((out.float() ** 2).sum(dim=1))
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters()))
        assert all(p.grad.dtype == torch.float32 for p in model.parameters())
        errors.append(abs(float(norm) / clip - 1.0))
    bk.detach()
    return errors


def test_bk_clips_in_float32_under_bf16_autocast():
    """One example whose gradient is far above C: the clipped gradient BK writes has norm C to
    float32 rounding, though the forward and backward ran in bfloat16 (norms taken in bfloat16
    miss C by ~1e-3)."""
    errors = clipped_norm_errors(CPU, "bf16")
    assert max(errors) < 2e-6, errors


def _users(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 40, (n, 9)) for n in (5, 9, 3, 7)]


def _model() -> nn.Module:
    torch.manual_seed(1)
    return LSTMLanguageModel(40, embed_dim=8, hidden_size=12, projection_dim=8)


def test_cohort_parallel_example_dp_clips_in_float32_under_bf16(monkeypatch):
    """Every example sampled, one step, no noise, an example clip far below the gradients: each
    client's delta is −lr/D · Σ_i clip(g_i), of norm lr·C/D with one row per client (to the
    rounding of θ_new − θ_old); and the clipped sum is taken with autocast off and IEEE float32."""
    dp = ExampleDP(sampling_rate=1.0, steps=1, clip_norm=1e-3, noise_multiplier=0.0, delta=1e-5, denominator=2.0)
    local = LocalConfig(lr=0.5, dp=dp, precision="bf16")
    users = [u[:1] for u in _users()]
    model = _model()
    trainer = CohortTrainer(model, local, pad_id=0, parallel=4)
    seen = _spy_precision(monkeypatch, torch, "einsum")
    out = trainer.updates(get_flat_params(model), users, [client_draws(10 + k) for k in range(len(users))])
    assert seen and all(not autocast and all(v in ("ieee", False) for v in state) for autocast, state in seen)
    for delta, _ in out:
        assert float(delta.double().norm()) == pytest.approx(0.5 * 1e-3 / 2.0, rel=1e-4)


def test_bf16_changes_the_local_steps_and_loop_and_parallel_agree():
    """bf16 is not a no-op (the delta differs from fp32's) yet computes the same update (cosine
    > 0.99); the loop and cohort-parallel chunks agree in bf16 as they do in fp32, up to
    bfloat16's rounding."""
    users = _users()
    model = _model()
    params = get_flat_params(model)
    fp32, bf16 = LocalConfig(lr=0.4, batch_size=3), LocalConfig(lr=0.4, batch_size=3, precision="bf16")
    for k, rows in enumerate(users):
        d32, _ = local_update(model, params, rows, fp32, client_draws(k))
        d16, _ = local_update(model, params, rows, bf16, client_draws(k))
        assert d16.dtype == torch.float32
        assert float((d16 - d32).norm()) > 1e-4 * float(d32.norm())
        assert float(torch.nn.functional.cosine_similarity(d16, d32, dim=0)) > 0.99
    trainer = CohortTrainer(_model(), bf16, pad_id=0, parallel=4)
    par = trainer.updates(params, users, [client_draws(k) for k in range(len(users))])
    for k, rows in enumerate(users):
        d16, _ = local_update(model, params, rows, bf16, client_draws(k))
        assert float(torch.nn.functional.cosine_similarity(par[k][0], d16, dim=0)) > 0.99


def test_lower_precision_with_per_sample_clipping_exits_2_and_writes_nothing(run_cli, tmp_path):
    """Book-Keeping's sample-separation checks compare gradients at float32 tolerance: bf16 with
    per-sample clipping is one error line, exit 2, no run directory."""
    out = tmp_path / "run"
    res = run_cli("+experiment=smoke", "client.dp=example", "client.precision=bf16", f"run_dir={out}")
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: client.precision=bf16 cannot run with per-sample")
    assert not out.exists()


@pytest.mark.parametrize("overrides,refused", [
    ((), False), (("client.dp=example",), True), (("algorithm=dp_fedsgd",), True),
    (("algorithm=dp_fedsgd", "algorithm.one_pass=false"), False), (("algorithm=dpsgd",), True)])
def test_which_algorithms_take_a_lower_precision(tmp_path, overrides, refused):
    from conftest import compose_cfg
    from fedpriv.round.algorithms import build_algorithm
    from fedpriv.config.resolve import run_config

    algorithm = build_algorithm(run_config(compose_cfg("+experiment=smoke", *overrides, run_dir=tmp_path / "r")))
    algorithm.check_precision("fp32")
    for precision in ("tf32", "bf16"):
        if refused:
            with pytest.raises(ConfigError, match=f"client.precision={precision} cannot run"):
                algorithm.check_precision(precision)
        else:
            algorithm.check_precision(precision)


def test_the_device_clip_and_sum_and_evaluation_run_in_ieee_float32(tmp_path, monkeypatch):
    """With client.precision=bf16 and cohort-parallel chunks, each delta is clipped and added with
    autocast off and the float32 switches IEEE (the round's sum keeps its bound); evaluation too
    (metrics compare across modes), even when called inside a bf16 block."""
    import fedpriv.round.clients as clients
    import fedpriv.runner as runner
    from conftest import compose_cfg
    from fedpriv.round.aggregation import RoundAggregate
    from fedpriv.runner import prepare

    seen = _spy_precision(monkeypatch, RoundAggregate, "add")
    session = prepare(compose_cfg("+experiment=smoke", "progress=false", "rounds=1", "cohort_size=6",
                                  "client.parallel=3", "client.parallel_on_cpu=true", "client.precision=bf16",
                                  run_dir=tmp_path / "r"))
    session.run.unlock()
    assert session.task.trainer is not None and session.task.local.precision == "bf16"
    cohort = session.server.cohort(0)
    inputs = session.server.round_inputs(0, cohort)
    host = RoundAggregate.zeros(inputs.params.numel(), inputs.clip_norm)
    clients.in_process_round_fn(session.task, session.spec)(inputs).add_to(host, {int(u) for u in cohort}, 0)
    assert host.accepted == len(cohort) == len(seen)
    assert all(not autocast and all(v in ("ieee", False) for v in state) for autocast, state in seen)

    evaluated = _spy_precision(monkeypatch, runner, "evaluate")
    with compute_precision("bf16", CPU):
        metrics = runner.evaluate_params(session.task, inputs.params)
    assert evaluated == [(False, [v for v in _state_in("fp32")])] and metrics["loss"] > 0


def _state_in(mode: str) -> list[object]:
    with compute_precision(mode, CPU):
        return _state()
