"""Per-round observability besides ``metrics.jsonl``: structured log lines and TensorBoard.

* ``verbose=true``: one INFO line per round on the ``fedpriv.rounds`` logger, as ``key=value``
  pairs — ``round=12 cohort=148 dropped=0 rejected=0 clipped=0.068 epsilon=0.6164`` (plus the
  test metrics on evaluation rounds). Quiet by default: the progress bar is the only output.
* ``tensorboard=true``: every numeric metric of the round as a scalar under
  ``RUN_DIR/tensorboard`` (needs the ``tensorboard`` package: ``pip install -e ".[tensorboard]"``).
"""

from __future__ import annotations

import importlib.util
import logging
import math
from pathlib import Path

from fedpriv.errors import ConfigError

round_log = logging.getLogger("fedpriv.rounds")

_LINE_KEYS = (("round", "round", "d"), ("cohort", "cohort_size", "d"), ("dropped", "dropped", "d"),
              ("rejected", "rejected", "d"), ("clipped", "clipped_fraction", ".3f"), ("epsilon", "epsilon", ".4g"))


def check_observability(cfg: dict) -> None:
    """Fail before the run when TensorBoard logging is asked for but not installed."""
    if cfg.get("tensorboard") and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError('tensorboard=true needs the tensorboard package: pip install -e ".[tensorboard]"')


def format_round(row: dict) -> str:
    """The structured line of one round."""
    parts = []
    for name, key, fmt in _LINE_KEYS:
        if key in row:
            value = row[key]
            parts.append(f"{name}={int(value) if fmt == 'd' else format(value, fmt)}")
    for key in ("test_accuracy", "test_loss"):
        if key in row:
            parts.append(f"{key}={row[key]:.4f}")
    return " ".join(parts)


class RoundObserver:
    """Sends each finished round to the log (``verbose``) and TensorBoard (``tensorboard``)."""

    def __init__(self, cfg: dict, run_dir: Path) -> None:
        round_log.setLevel(logging.INFO if cfg.get("verbose") else logging.WARNING)
        self.writer = None
        if cfg.get("tensorboard"):
            check_observability(cfg)
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def __call__(self, row: dict) -> None:
        round_log.info("%s", format_round(row))
        if self.writer is not None:
            for key, value in row.items():
                if key != "round" and isinstance(value, (int, float)) and math.isfinite(value):
                    self.writer.add_scalar(key, value, global_step=int(row["round"]))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
