"""The accelerator gives the CPU's results (``pytest -m cuda``; scripts/gpu_check.sh).

Every algorithm and mechanism runs with ``device=cuda`` (the model, client training, Book-Keeping
and evaluation on the GPU; noise, aggregate and optimizer on the host) and ends where the same run
on the CPU ends; Book-Keeping's per-sample norms and clipped sums on the GPU equal the CPU's; the
cohort-parallel chunks equal the per-client loop on the GPU. Research mode: the runs share their
key (``device`` is presentation), so cohorts, client draws and noise are the same on both.

Without CUDA these are skipped; ``FEDPRIV_TEST_DEVICE=cpu`` runs them with the CPU standing in for
the accelerator (``scripts/gpu_check.sh --cpu-dry-run``): the same code paths, a check of the check.
"""

import json
import os

import pytest
import torch

from conftest import compose_cfg
from fedpriv.keys.research_key import research_key
from fedpriv.runner import prepare
from server.app import run_local
from test_clipping import MODES, assert_rel_close, bk_step, make_case

DEVICE = os.environ.get("FEDPRIV_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                       reason="no CUDA device (FEDPRIV_TEST_DEVICE=cpu runs these on the CPU)"),
    pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning"),
]

# each mechanism with a sampler it is accounted with
MECHANISMS = {"gaussian": ("mechanism=gaussian",), "tree": ("mechanism=tree", "sampling=cyclic"),
              "bandmf": ("mechanism=bandmf", "mechanism.bands=2", "sampling=cyclic_poisson"),
              "blt": ("mechanism=blt", "sampling=cyclic")}
ALGORITHMS = {"dp_fedavg": ("algorithm=dp_fedavg",), "dp_fedsgd": ("algorithm=dp_fedsgd",),
              "dpsgd": ("algorithm=dpsgd",),
              "example_dp": ("algorithm=dp_fedavg", "client.dp=example", "client.example.noise_multiplier=1.0")}
BASE = ("+experiment=smoke", "progress=false", "rounds=2")


def _relative_gap(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


def _run(tmp_path, name: str, *overrides: str):
    session = prepare(compose_cfg(*BASE, *overrides, run_dir=tmp_path / name))
    summary = run_local(session)
    return session, summary, json.loads((tmp_path / name / "privacy.json").read_text())


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_and_mechanism_runs_on_the_device(tmp_path, algorithm, mechanism):
    overrides = (*ALGORITHMS[algorithm], *MECHANISMS[mechanism])
    assert research_key(compose_cfg(*BASE, *overrides, f"device={DEVICE}", run_dir=tmp_path / "a")) == \
        research_key(compose_cfg(*BASE, *overrides, "device=cpu", run_dir=tmp_path / "b"))
    on_device, dev_summary, dev_privacy = _run(tmp_path, "device", *overrides, f"device={DEVICE}")
    assert on_device.task.device.type == DEVICE
    assert {p.device.type for p in on_device.task.client_model.parameters()} == {DEVICE}
    on_cpu, cpu_summary, cpu_privacy = _run(tmp_path, "cpu", *overrides, "device=cpu")
    assert dev_privacy == cpu_privacy  # the same accounting, noise multiplier and ε
    assert torch.isfinite(on_device.server.params).all()
    moved = _relative_gap(on_cpu.server.params, on_cpu.task.initial_params.to(on_cpu.server.params))
    assert moved > 1e-4  # the run trained: the comparison below is not between two initial models
    assert _relative_gap(on_device.server.params.cpu(), on_cpu.server.params) <= 1e-3 * max(moved, 1.0)
    assert dev_summary["final"]["loss"] == pytest.approx(cpu_summary["final"]["loss"], rel=1e-3)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["lstm", "padded_lstm", "transformer", "tied"])
def test_book_keeping_on_the_device_equals_the_cpu(case, mode):
    model, loss_fn, data = make_case(case)
    clip = 0.5
    cpu = bk_step(model, loss_fn, data, clip, mode)
    want_norms = cpu.last_norms.clone()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.to(DEVICE)
    dev = bk_step(model, loss_fn, tuple(d.to(DEVICE) for d in data), clip, mode)
    assert dev.last_norms.device.type == DEVICE
    assert_rel_close(dev.last_norms.cpu(), want_norms, what="norms")
    assert (want_norms > clip).any() or (want_norms < clip).any()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad.device.type == DEVICE
            assert_rel_close(p.grad.cpu(), want[name], what=name)


@pytest.mark.parametrize("extra", [(), ("client.dp=example", "client.example.noise_multiplier=1.0")],
                         ids=["sgd", "example_dp"])
def test_cohort_parallel_equals_the_loop_on_the_device(tmp_path, extra):
    loop, _, loop_privacy = _run(tmp_path, "loop", *extra, f"device={DEVICE}")
    par, _, par_privacy = _run(tmp_path, "par", *extra, f"device={DEVICE}", "client.parallel=3",
                                  "client.parallel_on_cpu=true")
    assert loop.task.trainer is None and par.task.trainer is not None
    assert par.task.trainer.device.type == DEVICE
    assert loop_privacy == par_privacy
    assert _relative_gap(par.server.params, loop.server.params) <= 1e-4


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_every_precision_clips_to_the_bound_on_the_device(precision):
    """client.precision changes the forward and backward, never the clip: a clipped example's
    gradient has norm C to float32 rounding in every mode (TF32 and bfloat16 norms would miss
    it by ~1e-3)."""
    from test_precision import clipped_norm_errors

    errors = clipped_norm_errors(torch.device(DEVICE), precision)
    assert max(errors) < 2e-6, errors


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
@pytest.mark.parametrize("parallel", [(), ("client.parallel=3", "client.parallel_on_cpu=true")], ids=["loop", "chunks"])
def test_lower_precision_runs_account_as_fp32(tmp_path, parallel, precision):
    """DP-FedAvg in TF32 or bfloat16 on the device, by the loop and in cohort-parallel chunks:
    the same ledger as fp32 (precision is not in the research key: the same cohorts and noise),
    and a finite model near fp32's."""
    exact, _, exact_privacy = _run(tmp_path, "fp32", *parallel, f"device={DEVICE}")
    low, _, low_privacy = _run(tmp_path, precision, *parallel, f"device={DEVICE}", f"client.precision={precision}")
    assert low_privacy == exact_privacy
    assert torch.isfinite(low.server.params).all()
    moved = _relative_gap(exact.server.params, exact.task.initial_params.to(exact.server.params))
    assert _relative_gap(low.server.params, exact.server.params) <= 0.1 * moved
