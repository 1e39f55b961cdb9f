"""Shared by the results scripts: run ``python -m fedpriv.simulate`` once per named run, skipping
runs whose ``summary.json`` already exists, and read the summaries back."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
from fedpriv.rundir import read_mapping  # noqa: E402


def run_once(path: Path, overrides: Sequence[str]) -> Path:
    """``python -m fedpriv.simulate OVERRIDES run_dir=PATH`` unless PATH already holds a finished run."""
    if not (path / "summary.json").exists():
        args = [*overrides, "progress=false", f"run_dir={path}"]
        print("python -m fedpriv.simulate", " ".join(args), flush=True)
        subprocess.run([sys.executable, "-m", "fedpriv.simulate", *args], check=True)
    return path


def summary(path: Path) -> dict | None:
    """The run's summary.json, or None while it has not finished."""
    f = path / "summary.json"
    return read_mapping(f, json.loads) if f.exists() else None
