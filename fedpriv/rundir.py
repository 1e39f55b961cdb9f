"""The files of one run directory, each written atomically (tmp file + ``os.replace``).

``config.yaml`` resolved config · ``metrics.jsonl`` one line per round · ``privacy.json`` the
ledger · ``summary.json`` final metrics + privacy + wall time · ``checkpoints/last.pt``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch
import yaml


def _json_safe(value: Any) -> Any:
    """Replace non-finite floats by strings so the output stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class RunDirectory:
    """Reads and writes the outputs of one run."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoints" / "last.pt"

    def create(self) -> None:
        (self.path / "checkpoints").mkdir(parents=True, exist_ok=True)

    def write_json(self, name: str, obj: dict) -> None:
        write_atomic(self.path / name, (json.dumps(_json_safe(obj), indent=2) + "\n").encode())

    def write_config(self, cfg: dict) -> None:
        write_atomic(self.path / "config.yaml", yaml.safe_dump(cfg, sort_keys=False).encode())

    def read_config(self) -> dict | None:
        path = self.path / "config.yaml"
        return yaml.safe_load(path.read_text()) if path.exists() else None

    def write_metrics(self, rows: list[dict]) -> None:
        """Rewrite ``metrics.jsonl`` with ``rows`` (used on resume to drop rounds after the checkpoint)."""
        write_atomic(self.path / "metrics.jsonl", "".join(json.dumps(_json_safe(r)) + "\n" for r in rows).encode())

    def append_metrics(self, row: dict) -> None:
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(_json_safe(row)) + "\n")

    def read_metrics(self) -> list[dict]:
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def save_checkpoint(self, state: dict) -> None:
        tmp = self.checkpoint_path.with_name("last.pt.tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.checkpoint_path)

    def load_checkpoint(self) -> dict | None:
        if not self.checkpoint_path.exists():
            return None
        return torch.load(self.checkpoint_path, weights_only=False)
