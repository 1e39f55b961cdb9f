"""A TensorBoard event file that holds no wall-clock time and no host name, PID or start time.

TensorBoard's own writers stamp every event with ``time.time()`` and name the file
``events.out.tfevents.<start time>.<host>.<pid>.<n>``: how long a round took depends on who was
sampled, so neither may reach a secure run's directory (docs/PRIVACY.md). This writer produces
the same records (TFRecord framing of ``Event`` protos, read by TensorBoard and its
``EventAccumulator``) with ``wall_time = 0`` in every event, in one file of a fixed name,
:data:`EVENT_FILE`. It is written whole at the start of a run (or a resume: the header, the text
entries and every earlier round), then appended one round at a time, so the file is a function of
the run's metrics alone. Needs the ``tensorboard`` package (``pip install -e ".[tensorboard]"``).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from fedpriv.release.atomic import write_atomic

EVENT_FILE = "events.out.tfevents.fedpriv"
WALL_TIME = 0.0  # every event's time: none is recorded


def _record(event) -> bytes:
    """One TFRecord: length, masked CRC of the length, the serialized event, masked CRC of it."""
    from tensorboard.summary.writer.record_writer import RecordWriter  # lazy: optional package

    buffer = io.BytesIO()
    RecordWriter(buffer).write(event.SerializeToString())
    return buffer.getvalue()


def _header() -> bytes:
    from tensorboard.compat.proto.event_pb2 import Event  # lazy: optional package

    return _record(Event(wall_time=WALL_TIME, file_version="brain.Event:2"))


def _text(tag: str, value: str) -> bytes:
    from tensorboard.compat.proto.event_pb2 import Event  # lazy: optional package
    from torch.utils.tensorboard.summary import text  # lazy: needs the optional tensorboard

    return _record(Event(wall_time=WALL_TIME, step=0, summary=text(tag, value)))


def _scalars(row: Mapping[str, Any]) -> bytes:
    """Every finite number of a metrics row but its round, as scalars at step ``round``."""
    from tensorboard.compat.proto.event_pb2 import Event  # lazy: optional package
    from torch.utils.tensorboard.summary import scalar  # lazy: needs the optional tensorboard

    step = int(row["round"])
    return b"".join(_record(Event(wall_time=WALL_TIME, step=step, summary=scalar(key, float(value))))
                    for key, value in row.items()
                    if key != "round" and isinstance(value, (int, float)) and math.isfinite(value))


class EventFile:
    """``directory/EVENT_FILE``: texts and earlier rows written at once, then one row per call."""

    def __init__(self, directory: Path, texts: Mapping[str, str], rows: Iterable[Mapping[str, Any]] = ()) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / EVENT_FILE
        body = _header() + b"".join(_text(tag, value) for tag, value in texts.items())
        write_atomic(self.path, body + b"".join(_scalars(row) for row in rows))
        self._file: BinaryIO | None = open(self.path, "ab")  # noqa: SIM115 (closed by close())

    def add_row(self, row: Mapping[str, Any]) -> None:
        if self._file is None:
            raise ValueError("the event file is closed")
        self._file.write(_scalars(row))
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
