"""Where fedpriv keeps computed artifacts (BandMF strategies, teachers, distillation corpora)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$FEDPRIV_CACHE``, else ``~/.cache/fedpriv``."""
    return Path(os.environ.get("FEDPRIV_CACHE") or Path.home() / ".cache" / "fedpriv")
