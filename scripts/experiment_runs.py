"""Shared by the results scripts: run ``python -m fedpriv.simulate`` once per named run, skipping
runs whose ``summary.json`` already exists (one at a time, or ``jobs`` at a time with one torch
thread each), and read the summaries back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
from fedpriv.rundir import read_mapping  # noqa: E402


def run_once(path: Path, overrides: Sequence[str], threads: int | None = None) -> Path:
    """``python -m fedpriv.simulate OVERRIDES run_dir=PATH`` unless PATH already holds a finished run;
    ``threads`` caps torch's threads (``OMP_NUM_THREADS``) for runs that share the machine."""
    if not (path / "summary.json").exists():
        env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0")
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        args = [*overrides, "progress=false", f"run_dir={path}"]
        print("python -m fedpriv.simulate", " ".join(args), flush=True)
        subprocess.run([sys.executable, "-m", "fedpriv.simulate", *args], check=True, env=env,
                       stdout=subprocess.DEVNULL if threads else None)
    return path


def run_all(out: Path, named: Mapping[str, Sequence[str]], jobs: int = 1) -> None:
    """Every ``name → overrides`` into ``OUT/<name>/``, in order, ``jobs`` at a time (more than one:
    one torch thread each, so wall times are then not comparable with single runs)."""
    threads = 1 if jobs > 1 else None
    with ThreadPoolExecutor(jobs) as pool:
        for f in [pool.submit(run_once, out / k, v, threads) for k, v in named.items()]:
            f.result()


def summary(path: Path) -> dict | None:
    """The run's summary.json, or None while it has not finished."""
    f = path / "summary.json"
    return read_mapping(f, json.loads) if f.exists() else None


def evaluations(path: Path) -> list[dict]:
    """The run's metrics.jsonl rows that carry a test evaluation, in round order."""
    rows = map(json.loads, (path / "metrics.jsonl").read_text().splitlines())
    return [r for r in rows if "test_loss" in r]
