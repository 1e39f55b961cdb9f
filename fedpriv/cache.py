"""Where fedpriv keeps computed artifacts (BandMF and BLT strategies, teachers, distillation
corpora), and the one way tensors are stored there: a keyed ``torch.save`` dict written atomically,
read back as plain data only. The cache is never trusted: a reader checks what it loads."""

from __future__ import annotations

import io
import os
from pathlib import Path

import torch

from fedpriv.release.atomic import write_atomic


def cache_root() -> Path:
    """``$FEDPRIV_CACHE``, else ``~/.cache/fedpriv``."""
    return Path(os.environ.get("FEDPRIV_CACHE") or Path.home() / ".cache" / "fedpriv")


def load_entry(path: Path, key: str) -> dict | None:
    """The dict stored at ``path`` under ``key``, or None (missing, unreadable, not plain data, or
    another key)."""
    if not path.exists():
        return None
    try:
        stored = torch.load(path, weights_only=True)
    except Exception:  # unreadable, truncated, or not plain data
        return None
    return stored if isinstance(stored, dict) and stored.get("key") == key else None


def save_entry(path: Path, key: str, entry: dict, *, private: bool = False) -> None:
    """Store ``{"key": key, **entry}`` at ``path`` atomically (a reader never sees half a file);
    ``private``: owner-only (0600), also where it replaces an older, readable file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save({"key": key, **entry}, buffer)
    write_atomic(path, buffer.getvalue(), private=private)
