"""Per-round observability besides ``metrics.jsonl``: structured log lines and TensorBoard.

Both carry exactly the round's ``metrics.jsonl`` row — quantities the epsilon covers and
test-set metrics — never the statistics of training users (those go, in research mode only, to
``diagnostics.jsonl``; see :mod:`fedpriv.release.rundir`).

* ``verbose=true``: one INFO line per round on the ``fedpriv.rounds`` logger, as ``key=value``
  pairs — ``round=12 epsilon=0.6164 mode=research`` (plus the test metrics on evaluation rounds).
  Quiet by default: the progress bar is the only output.
* ``tensorboard=true``: every numeric metric of the round as a scalar under
  ``RUN_DIR/tensorboard``, and the run's randomness mode (and, for an audited run, its canaries)
  as text entries, in an event file with no wall-clock time, host name or PID
  (:mod:`fedpriv.release.tensorboard_events`; needs the ``tensorboard`` package:
  ``pip install -e ".[tensorboard]"``).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from fedpriv.errors import ConfigError
from fedpriv.schema import RunConfig

round_log = logging.getLogger("fedpriv.rounds")
TENSORBOARD_DIR = "tensorboard"  # the event file's directory under the run directory

_LINE_KEYS = (("round", "round", "d"), ("epsilon", "epsilon", ".4g"))


def check_observability(spec: RunConfig) -> None:
    """Fail before the run when TensorBoard logging is asked for but not installed."""
    if spec.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError('tensorboard=true needs the tensorboard package: pip install -e ".[tensorboard]"')


def format_round(row: dict) -> str:
    """The structured line of one round."""
    parts = []
    for name, key, fmt in _LINE_KEYS:
        if row.get(key) is not None:
            value = row[key]
            parts.append(f"{name}={int(value) if fmt == 'd' else format(value, fmt)}")
    if row.get("non_private"):
        parts.append("epsilon=inf non_private=true")
    if "mode" in row:
        parts.append(f"mode={row['mode']}")
    for key in ("test_accuracy", "test_loss"):
        if key in row:
            parts.append(f"{key}={row[key]:.4f}")
    return " ".join(parts)


class RoundObserver:
    """Sends each finished round to the log (``verbose``) and TensorBoard (``tensorboard``).

    ``texts``: TensorBoard text entries (tag -> text: the randomness mode, an audit's label);
    ``history``: the rows of rounds already done (a resumed run's event file is written anew with
    them, so it holds every round once)."""

    def __init__(self, spec: RunConfig, run_dir: Path, texts: dict[str, str] | None = None,
                 history: list[dict] | None = None) -> None:
        round_log.setLevel(logging.INFO if spec.verbose else logging.WARNING)
        self.events = None
        if spec.tensorboard:
            check_observability(spec)
            from fedpriv.release.tensorboard_events import EventFile  # lazy: the optional tensorboard package

            self.events = EventFile(run_dir / TENSORBOARD_DIR, texts or {}, history or [])

    def __call__(self, row: dict) -> None:
        round_log.info("%s", format_round(row))
        if self.events is not None:
            self.events.add_row(row)

    def close(self) -> None:
        if self.events is not None:
            self.events.close()
