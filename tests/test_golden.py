"""Golden outputs: a matrix of smoke runs must reproduce what was frozen in tests/golden/ —
privacy.json exactly, metrics.jsonl (wall times dropped) up to float drift (METRICS_RTOL), and a
fingerprint of the final server parameters and released model (PARAMS_RTOL) — and the same
combinations must still be refused. Bit-for-bit equality holds on one machine (the resume and
backend tests pin it); between CPUs the last bits of float kernels differ, so the oracle allows
that drift and nothing more.

Runs on one torch thread: results depend on the thread count.
This is the oracle of refactoring: code may move, outputs may not. A golden file changes only in
a commit that says why. To re-freeze after an intended change of outputs::

    FEDPRIV_FREEZE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_golden.py
"""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path

import pytest
import torch

from conftest import compose_cfg

GOLDEN = Path(__file__).resolve().parent / "golden"
BASE = ("+experiment=smoke", "progress=false")
MECHANISMS = ("gaussian", "tree", "bandmf")
ALGORITHMS = ("dp_fedavg", "dp_fedsgd", "dpsgd")
OPTIMIZERS = ("sgd", "dpadam_post", "dpadam_ime", "dpadam_stp")
# name -> overrides beyond BASE
CASES: dict[str, tuple[str, ...]] = {
    f"{m}-{a}-{o}": (f"mechanism={m}", f"algorithm={a}", f"optimizer={o}",
                     *(("mechanism.bands=2",) if m == "bandmf" else ()))
    for m, a, o in itertools.product(MECHANISMS, ALGORITHMS, OPTIMIZERS)
}
CASES.update({
    "gaussian-default-momentum": (),
    "gaussian-pld": ("privacy.accountant=pld", "privacy.noise_multiplier=1.0"),
    "gaussian-fixed": ("sampling=fixed",),
    "gaussian-sigma": ("privacy.noise_multiplier=1.3", "ema_decay=0"),
    "gaussian-fedsgd-loop": ("algorithm=dp_fedsgd", "algorithm.one_pass=false", "optimizer=dpadam_ime"),
    "tree-ftrl": ("mechanism=tree", "optimizer=ftrl"),
    "tree-ftrl-restart": ("mechanism=tree", "optimizer=ftrl", "mechanism.restart_every=2",
                          "mechanism.estimator=plain"),
    "bandmf-cyclic-momentum": ("mechanism=bandmf", "mechanism.bands=2", "sampling=cyclic"),
    "gaussian-adagrad-bc": ("optimizer=dpadagrad_bc",),
    "example-dp": ("client.dp=example", "client.example.steps=2"),
    "public-pretrain": ("public.pretrain_steps=5", "public.pretrain_fraction=0.5"),
    "mid-training": ("public.mid_training_round=2", "public.mid_training_score=private",
                     "public.mid_training_steps=5", "public.mid_training_fraction=0.2"),
})


@pytest.fixture(autouse=True)
def _one_thread():
    """Float reductions depend on torch's thread count, so the oracle runs on one thread (which
    is also what the whole suite runs on: several test modules set it at import)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Float results differ in their last bits between CPUs (vectorised kernels, BLAS blocking): the
# frozen parameters are compared as a fingerprint within PARAMS_RTOL, not bit for bit. Any change of
# the cohorts, the noise or the update moves them by orders of magnitude more.
PARAMS_RTOL = 1e-4
METRICS_RTOL = 1e-6
SAMPLES = 64


def _fingerprint(tensor) -> dict:
    """Size, L2 norm and ``SAMPLES`` evenly spaced coordinates of a flat parameter vector."""
    flat = tensor.detach().reshape(-1).to(torch.float64)
    idx = torch.linspace(0, flat.numel() - 1, SAMPLES).round().long().unique()
    return {"numel": flat.numel(), "norm": float(flat.norm()), "sample": [float(v) for v in flat[idx]]}


def _close(got: dict, want: dict) -> bool:
    """Fingerprints equal up to float drift: the same size, norms within PARAMS_RTOL, and every
    sampled coordinate within PARAMS_RTOL of the norm's RMS scale."""
    if got["numel"] != want["numel"] or len(got["sample"]) != len(want["sample"]):
        return False
    scale = want["norm"] / math.sqrt(want["numel"])
    return (math.isclose(got["norm"], want["norm"], rel_tol=PARAMS_RTOL)
            and all(abs(a - b) <= PARAMS_RTOL * scale for a, b in zip(got["sample"], want["sample"])))


def run_case(overrides: tuple[str, ...], run_dir: Path) -> dict:
    """The golden record of one in-process run (or ``{"refused": True}`` for a config error)."""
    from fedpriv.errors import ConfigError
    from fedpriv.runner import prepare
    from server.app import run_local

    cfg = compose_cfg(*BASE, *overrides, run_dir=run_dir)
    try:
        session = prepare(cfg)
    except ConfigError:
        return {"overrides": list(overrides), "refused": True}
    run_local(session)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "overrides": list(overrides),
        "refused": False,
        "privacy": json.loads((run_dir / "privacy.json").read_text()),
        "metrics": [{k: v for k, v in row.items() if "wall" not in k} for row in rows],
        "params": _fingerprint(session.server.params),
        "released": _fingerprint(session.server.model_params),
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str, tmp_path: Path) -> None:
    got = run_case(CASES[name], tmp_path / "run")
    path = GOLDEN / f"{name}.json"
    if os.environ.get("FEDPRIV_FREEZE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    for row_got, row_want in zip(got.get("metrics", []), want.get("metrics", [])):
        for key, value in row_want.items():
            if isinstance(value, float) and key != "epsilon" and isinstance(row_got.get(key), float):
                assert math.isclose(row_got[key], value, rel_tol=METRICS_RTOL), f"{name}: {key} differs"
                row_got[key] = value
    for part in ("params", "released") if not want["refused"] else ():
        assert _close(got.pop(part), want.pop(part)), f"{name}: {part} differ from {path.name}"
    assert got == want, f"{name}: outputs differ from {path.name}"


def test_every_golden_file_has_a_case() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(CASES)
