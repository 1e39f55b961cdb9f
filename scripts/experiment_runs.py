"""Shared by the results scripts: run ``python -m fedpriv.simulate`` once per named run, skipping
runs whose ``summary.json`` already exists, and read the summaries back."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


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
    return json.loads(f.read_text()) if f.exists() else None
