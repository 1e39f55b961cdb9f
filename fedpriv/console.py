"""How fedpriv's log records read on the console (``configs/hydra/job_logging/fedpriv.yaml``, and
the ``python -m fedpriv.accounting`` calculator).

Informational lines (the ``verbose=true`` round lines) are printed as they are; a warning reads
``warning: <message>`` and an error ``error: <message>``, like the one-line errors the CLIs print.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn

EXIT_BAD_INPUT = 2  # every CLI's exit status for bad input


class ConsoleFormatter(logging.Formatter):
    """``%(message)s`` for INFO and below; ``warning: `` / ``error: `` in front of the rest."""

    def __init__(self, fmt: str = "%(message)s", datefmt: str | None = None) -> None:
        super().__init__(fmt, datefmt)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.ERROR:
            return f"error: {text}"
        if record.levelno >= logging.WARNING:
            return f"warning: {text}"
        return text


def console_handler(stream=None, level: int = logging.NOTSET) -> logging.Handler:
    """A stream handler (stderr by default) with :class:`ConsoleFormatter`."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(ConsoleFormatter())
    handler.setLevel(level)
    return handler


def fail(message: str) -> NoReturn:
    """Print ``error: <message>`` as one line on stderr and exit with :data:`EXIT_BAD_INPUT`."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one ``error: ...`` line and exit status 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        fail(message)
