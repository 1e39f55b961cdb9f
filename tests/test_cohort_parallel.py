"""Cohort-parallel local training (client.parallel > 1) gives every client the per-client loop's
delta; device selection; Flower's per-worker GPU resources."""

import json

import numpy as np
import pytest
import torch

from conftest import compose_cfg
from fedpriv.clipping import BookKeeping
from fedpriv.round.cohort_parallel import CohortTrainer
from fedpriv.errors import ConfigError
from fedpriv.round.local_dp import ExampleDP
from fedpriv.models import LSTMLanguageModel, TransformerLanguageModel, get_flat_params, vmappable
from fedpriv.keys.research_key import research_key
from fedpriv.runner import prepare
from fedpriv.round.training import LocalConfig, local_update

from helpers import client_draws
from server.app import client_resources, run_local

VOCAB, WIDTH = 40, 9


def _ragged_users(seed: int = 0) -> list[np.ndarray]:
    """Users of 1 to 23 rows whose sentences end at random lengths (trailing pad)."""
    rng = np.random.default_rng(seed)
    users = []
    for n in (1, 3, 23, 2, 11, 6, 17):
        rows = rng.integers(1, VOCAB, (n, WIDTH))
        for row in rows:
            row[int(rng.integers(2, WIDTH + 1)):] = 0
        users.append(rows)
    return users


MODELS = {
    "lstm": lambda: LSTMLanguageModel(VOCAB, embed_dim=8, hidden_size=12, projection_dim=8),
    "transformer": lambda: TransformerLanguageModel(VOCAB, d_model=16, num_layers=2, num_heads=4, ff_dim=24,
                                                    max_len=WIDTH),
}


def _loop_and_parallel(model_name: str, local: LocalConfig, parallel: int, diagnostics: bool):
    users = _ragged_users()
    torch.manual_seed(1)
    model = MODELS[model_name]()
    params = get_flat_params(model)
    bk = (BookKeeping(model, clip_norm=local.dp.clip_norm, noise_multiplier=local.dp.noise_multiplier)
          if local.dp else None)
    loop = [local_update(model, params, rows, local, client_draws(100 + u), bk=bk,
                         diagnostics=diagnostics) for u, rows in enumerate(users)]
    trainer = CohortTrainer(MODELS[model_name](), local, pad_id=0, parallel=parallel)
    vectorized = trainer.updates(params, users, [client_draws(100 + u) for u in range(len(users))],
                                 diagnostics=diagnostics)
    return loop, vectorized


@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("parallel", [3, 7])
def test_parallel_sgd_equals_the_loop(model_name, parallel):
    """Ragged users (1..23 rows, 1..7 steps, a last batch smaller, two epochs), chunked or not."""
    local = LocalConfig(epochs=2, batch_size=4, lr=0.4, max_steps=7)
    loop, vectorized = _loop_and_parallel(model_name, local, parallel, diagnostics=True)
    for (d_loop, m_loop), (d_par, m_par) in zip(loop, vectorized):
        assert d_loop.abs().max() > 1e-3  # every client moved
        torch.testing.assert_close(d_par, d_loop, rtol=1e-5, atol=1e-6)
        assert m_par.keys() == m_loop.keys() and m_par["num_steps"] == m_loop["num_steps"]
        assert m_par["train_loss"] == pytest.approx(m_loop["train_loss"], rel=1e-5)
    assert sorted({m["num_steps"] for _, m in loop}) == [2.0, 4.0, 6.0, 7.0]  # ragged step counts


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_parallel_example_dp_equals_the_loop(model_name):
    """Example-level DP-SGD: the same masks and noise streams, per-example clipping as BK's."""
    dp = ExampleDP(sampling_rate=0.3, steps=3, clip_norm=0.05, noise_multiplier=0.8, delta=1e-5, denominator=3.0)
    local = LocalConfig(lr=0.5, dp=dp)
    loop, vectorized = _loop_and_parallel(model_name, local, parallel=4, diagnostics=False)
    for (d_loop, m_loop), (d_par, m_par) in zip(loop, vectorized):
        assert m_loop == m_par == {}
        torch.testing.assert_close(d_par, d_loop, rtol=1e-5, atol=1e-6)


def test_parallel_example_dp_clips_each_example():
    """Without noise, a step's update is the clipped sum: with a tiny C every example is at the
    bound, so one step of one example moves the parameters by exactly lr·C/D."""
    dp = ExampleDP(sampling_rate=1.0, steps=1, clip_norm=1e-3, noise_multiplier=0.0, delta=1e-5, denominator=2.0)
    rows = _ragged_users()[0]  # one row
    model = MODELS["lstm"]()
    trainer = CohortTrainer(model, LocalConfig(lr=0.5, dp=dp), pad_id=0, parallel=2)
    (delta, _), = trainer.updates(get_flat_params(model), [rows], [client_draws(0)])
    assert float(delta.norm()) == pytest.approx(0.5 * 1e-3 / 2.0, rel=1e-4)


def test_vmappable_replica_computes_the_same_function():
    for name, make in MODELS.items():
        model = make()
        x = torch.as_tensor(_ragged_users()[2][:, :-1])
        torch.testing.assert_close(vmappable(model)(x), model(x), rtol=1e-5, atol=1e-6, msg=name)


def test_parallel_run_matches_the_loop_and_keeps_the_research_key(tmp_path):
    """End to end: client.parallel changes how, not what — same key, cohorts, noise and ε."""
    base = ("+experiment=smoke", "progress=false", "rounds=2")
    loop_cfg = compose_cfg(*base, run_dir=tmp_path / "loop")
    par_cfg = compose_cfg(*base, "client.parallel=3", "client.parallel_on_cpu=true", run_dir=tmp_path / "par")
    assert research_key(loop_cfg) == research_key(par_cfg)
    loop, par = prepare(loop_cfg), prepare(par_cfg)
    assert loop.task.trainer is None and par.task.trainer is not None
    run_local(loop)
    run_local(par)
    torch.testing.assert_close(par.server.params, loop.server.params, rtol=1e-4, atol=1e-6)
    a = json.loads((tmp_path / "loop" / "privacy.json").read_text())
    b = json.loads((tmp_path / "par" / "privacy.json").read_text())
    assert a == b


def test_device_cuda_without_cuda_exits_2_and_writes_nothing(run_cli, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "run"
    res = run_cli("+experiment=smoke", "device=cuda", f"run_dir={out}")
    assert res.returncode == 2
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: device=cuda") and "CUDA" in lines[0]
    assert not out.exists()


def test_device_is_resolved_and_checked(tmp_path):
    session = prepare(compose_cfg("+experiment=smoke", "device=cpu", "rounds=1", run_dir=tmp_path / "r"))
    session.run.unlock()
    assert session.task.device == torch.device("cpu")
    assert next(session.task.client_model.parameters()).device.type == "cpu"
    with pytest.raises(ConfigError, match="client.parallel"):
        prepare(compose_cfg("+experiment=smoke", "client.parallel=0", run_dir=tmp_path / "bad"))


def test_flower_client_gpus_become_ray_resources():
    from fedpriv.schema import FlowerBackend

    assert client_resources(FlowerBackend(client_cpus=1, client_gpus=0)) == {"num_cpus": 1.0}
    assert client_resources(FlowerBackend(client_cpus=2, client_gpus=0.25)) == {"num_cpus": 2.0, "num_gpus": 0.25}


# slow (a second Ray engine, ~25 s): the parallel ClientApp equals the loop end to end in
# test_parallel_run_matches_the_loop_and_keeps_the_research_key, and Flower's engine (two nodes)
# equals the local grid bit for bit in tests/test_simulate.py::test_local_and_flower_backends_give_the_same_model
@pytest.mark.slow
def test_flower_workers_run_parallel_chunks_like_the_local_loop(tmp_path):
    """Flower's engine with two nodes, each running its users in cohort-parallel chunks, gives
    the in-process loop's model (float tolerance) and the identical ledger."""
    from server.app import run_flower_simulation

    local = prepare(compose_cfg("+experiment=smoke", "progress=false", "rounds=2", run_dir=tmp_path / "local"))
    run_local(local)
    flower = prepare(compose_cfg("+experiment=smoke", "progress=false", "rounds=2", "backend=flower",
                                 "client.parallel=3", "client.parallel_on_cpu=true", run_dir=tmp_path / "flower"))
    summary = run_flower_simulation(flower)
    assert summary["backend"] == "flower" and summary["rounds"] == 2
    torch.testing.assert_close(flower.server.params, local.server.params, rtol=1e-4, atol=1e-6)
    a = json.loads((tmp_path / "local" / "privacy.json").read_text())
    b = json.loads((tmp_path / "flower" / "privacy.json").read_text())
    assert a == b


def test_public_stages_refuse_a_gpu_device():
    """Public pre-training/mid-training computes in host memory only: on a CUDA task it is one
    ConfigError before any public artifact is built."""
    from types import SimpleNamespace

    from fedpriv.public.setup import prepare_public
    from fedpriv.schema import Public

    task = SimpleNamespace(data=None, device=torch.device("cuda"), initial_params=None)
    with pytest.raises(ConfigError, match="device=cpu"):
        prepare_public(Public(pretrain_steps=5), task, seed=0)


def test_parallel_example_dp_run_matches_the_loop(tmp_path):
    """End to end with client.dp=example: the trainer's replica carries none of the clipping
    engine's hooks (it is copied before the engine attaches), and the run equals the loop's."""
    base = ("+experiment=smoke", "progress=false", "rounds=2", "client.dp=example",
            "client.example.noise_multiplier=1.0")
    loop, par = (prepare(compose_cfg(*base, *extra, run_dir=tmp_path / name))
                 for name, extra in (("loop", ()), ("par", ("client.parallel=3", "client.parallel_on_cpu=true"))))
    assert par.task.trainer is not None and par.task.bk is not None
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in par.task.trainer.model.modules())
    run_local(loop)
    run_local(par)
    torch.testing.assert_close(par.server.params, loop.server.params, rtol=1e-4, atol=1e-6)


def test_parallel_on_the_cpu_runs_the_loop_with_one_warning(tmp_path, caplog):
    """client.parallel > 1 on the CPU: the per-client loop (measured faster there), one warning
    naming client.parallel_on_cpu; the research key is the loop's (both are execution keys)."""
    base = ("+experiment=smoke", "progress=false", "rounds=1", "device=cpu")
    with caplog.at_level("WARNING"):
        session = prepare(compose_cfg(*base, "client.parallel=4", run_dir=tmp_path / "par"))
    session.run.unlock()
    assert session.task.trainer is None
    lines = [r.getMessage() for r in caplog.records if "client.parallel=4" in r.getMessage()]
    assert len(lines) == 1 and "per-client loop" in lines[0] and "client.parallel_on_cpu=true" in lines[0]
    keys = {research_key(compose_cfg(*base, *extra, run_dir=tmp_path / str(i))) for i, extra in
            enumerate([(), ("client.parallel=4",), ("client.parallel=4", "client.parallel_on_cpu=true")])}
    assert len(keys) == 1


def test_the_vmappable_recurrence_has_the_gradient_of_its_forward():
    """The cohort-parallel LSTM recurrence's own BPTT (one GEMM for W_hh's gradient over all
    steps) against finite differences, through both the hidden states and the cells; and under
    vmap(grad) over stacked weights it equals each client's own gradient."""
    from torch.func import grad, vmap

    from fedpriv.models.lstm import _VmappableRecurrence

    gen = torch.Generator().manual_seed(0)
    x_gates = torch.randn(3, 5, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    w_hh = torch.randn(8, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: _VmappableRecurrence.apply(x, w)[:2], (x_gates, w_hh))

    def loss(w, x):
        hidden, cells, _ = _VmappableRecurrence.apply(x, w)
        return (hidden ** 2).sum() + cells[:, -1].sum()

    ws = torch.randn(4, 8, 2, dtype=torch.float64, generator=gen)
    xs = torch.randn(4, 3, 5, 8, dtype=torch.float64, generator=gen)
    batched = vmap(grad(loss))(ws, xs)
    for k in range(4):
        torch.testing.assert_close(batched[k], grad(loss)(ws[k], xs[k]))


def test_the_recurrence_benchmark_runs_and_its_two_forms_agree(tmp_path, monkeypatch):
    """scripts/bench_recurrence.py on a tiny LSTM: both forms give the same deltas (no timing is
    checked)."""
    import importlib.util
    import sys
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "scripts" / "bench_recurrence.py"
    spec = importlib.util.spec_from_file_location("bench_recurrence", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "r.json"
    monkeypatch.setattr(sys, "argv", ["bench_recurrence.py", "--hidden", "12", "--vocab", "40", "--clients", "3",
                                      "--parallel", "3", "--repeats", "2", "--threads", "1", "--json", str(out)])
    module.main()
    result = json.loads(out.read_text())
    assert result["max_relative_delta_difference"] < 1e-5
