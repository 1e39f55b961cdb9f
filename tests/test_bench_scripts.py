"""scripts/bench_clipping.py's gpt2 config: its size, that a BK step runs, and that a mode Opacus
refuses is reported with its error instead of a number (cheap: no timing, one step)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_clipping.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_clipping", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpt2_config_size_and_tied_head(bench):
    model = bench.fedpriv_model("gpt2")
    lm = model.model
    assert lm.lm_head.weight is lm.transformer.wte.weight
    assert sum(p.numel() for p in model.parameters()) == 8_624_784
    x, y = bench.make_batch("gpt2")
    assert x.shape == y.shape == (32, 64)


def test_gpt2_bk_step_runs(bench):
    steps = bench.make_steps("gpt2", only="BK mixopt")
    assert list(steps) == ["BK mixopt"]
    steps["BK mixopt"]()


def test_gpt2_opacus_ghost_refusal_is_reported(bench):
    pytest.importorskip("opacus")
    bench.REFUSED.clear()
    steps = bench.make_steps("gpt2", only="Opacus ghost")
    if "Opacus ghost" in steps:  # built: a refusal, if any, comes at the first step
        times = bench.time_round_robin(steps, iters=1, warmup=0)
        if "Opacus ghost" in times:
            pytest.skip("this Opacus version clips GPT-2's tied embeddings with ghost clipping")
    assert "Opacus ghost" in bench.REFUSED
    assert "tying" in bench.REFUSED["Opacus ghost"]
    bench.REFUSED.clear()



def test_gpu_check_refuses_an_unknown_argument_before_doing_anything(tmp_path):
    import subprocess

    script = SCRIPT.parent / "gpu_check.sh"
    res = subprocess.run(["bash", str(script), "--nope", "--out", str(tmp_path / "o")], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().startswith("error: unknown argument --nope")
    assert not (tmp_path / "o").exists()
