"""How fedpriv's log records read on the console (``configs/hydra/job_logging/fedpriv.yaml``, and
the ``python -m fedpriv.accounting`` calculator and ``python -m fedpriv.plan``: :func:`console_logging`).

Informational lines (the ``verbose=true`` round lines) are printed as they are; a warning reads
``warning: <message>`` and an error ``error: <message>``, like the one-line errors the CLIs print.
stdout holds results (round lines, the final lines); stderr holds warnings, errors and advice: the
records of the :data:`ADVICE_LOGGER` (the noise scale before training, how to make a load faster)
at any level. In a ``-m`` sweep every stderr line names its member (:func:`set_member`).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path
from typing import NoReturn, Protocol

from fedpriv.errors import DamagedFileError

EXIT_BAD_INPUT = 2  # every CLI's exit status for bad input


# advisory lines (any level) go to stderr, never into the results on stdout; modules below the
# console (data loaders) log to this name with logging.getLogger, without importing this module
ADVICE_LOGGER = "fedpriv.advice"


def _advisory(record: logging.LogRecord) -> bool:
    return record.name == ADVICE_LOGGER or record.name.startswith(ADVICE_LOGGER + ".")


class ConsoleFormatter(logging.Formatter):
    """``%(message)s`` for INFO and below; ``warning: `` / ``error: `` in front of the rest; in a
    sweep, the member's label (:func:`set_member`) after that prefix on every stderr line."""

    member = ""  # "[member 3: seed=2] " while a sweep member runs

    def __init__(self, fmt: str = "%(message)s", datefmt: str | None = None) -> None:
        super().__init__(fmt, datefmt)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.ERROR:
            return f"error: {self.member}{text}"
        if record.levelno >= logging.WARNING:
            return f"warning: {self.member}{text}"
        return f"{self.member}{text}" if _advisory(record) else text


def set_member(number: int, overrides: list[str], command_line: list[str]) -> None:
    """Label the stderr lines of sweep member ``number`` (Hydra's job number) with the overrides
    that make it this member: those of its ``overrides`` whose key the ``command_line`` sweeps."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # lazy: hydra, kept off the CLIs' import

    parser = OverridesParser.create()
    swept = set()
    for arg in command_line:
        try:
            override = parser.parse_override(arg)
        except Exception:  # noqa: BLE001 — a flag (-m) or a flag's value: not an override
            continue
        if override.is_sweep_override():
            swept.add(override.get_key_element())
    own = [o for o in overrides if o.partition("=")[0] in swept]
    ConsoleFormatter.member = f"[member {number}{': ' + ' '.join(own) if own else ''}] "


class BelowLevelFilter(logging.Filter):
    """Passes only records whose level is below ``level`` (a number or a name such as ``WARNING``)
    and that are not advisory: the stdout handler of ``configs/hydra/job_logging/fedpriv.yaml``
    keeps INFO lines and leaves warnings, errors and advice to the stderr handler."""

    def __init__(self, level: int | str = logging.WARNING) -> None:
        super().__init__()
        self.level = level if isinstance(level, int) else logging.getLevelName(str(level).upper())
        if not isinstance(self.level, int):
            raise ValueError(f"unknown logging level {level!r}")

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < self.level and not _advisory(record)


class StderrFilter(logging.Filter):
    """Passes warnings and errors, and advisory records (:data:`ADVICE_LOGGER`) at any level: the
    stderr handler's share, the complement of :class:`BelowLevelFilter`'s at WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or _advisory(record)


def console_handler(stream=None, level: int = logging.NOTSET) -> logging.Handler:
    """A stream handler (stderr by default) with :class:`ConsoleFormatter`."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(ConsoleFormatter())
    handler.setLevel(level)
    return handler


def console_logging() -> None:
    """The console of a CLI that prints only its result (``python -m fedpriv.accounting``,
    ``python -m fedpriv.plan``): when nothing has configured logging yet, warnings and errors of
    every logger print on stderr as ``warning: ...`` / ``error: ...`` (:class:`ConsoleFormatter`) —
    fedpriv's own (a tree sensitivity bound used instead of the exact value) and dp_accounting's on
    absl's logger (a negative Renyi divergence), whose level is left as it is. Without it, absl's
    first log call would give the root logger Python's default ``WARNING:name:`` handler.
    dp_accounting's notes of RDP orders that do not converge (~30 per calibration) are dropped
    where they are logged (:data:`fedpriv.accounting.accountant.EXCLUDED_ORDER_NOTE`)."""
    if not logging.root.handlers:
        logging.root.addHandler(console_handler(sys.stderr))


def fail(message: str) -> NoReturn:
    """Print ``error: <message>`` as one line on stderr and exit with :data:`EXIT_BAD_INPUT`."""
    print(f"error: {ConsoleFormatter.member}{' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one ``error: ...`` line and exit status 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        fail(message)


# --- what the run CLIs (fedpriv.simulate, server.deploy) print ------------------------------------

class RunDirectoryView(Protocol):
    """What :func:`interrupted_message` reads of a :class:`fedpriv.release.rundir.RunDirectory` (named by
    its methods, not imported: the run directory's module imports torch, which the CLIs' ``--help``
    and the accounting calculator do without)."""

    path: Path

    def load_checkpoint(self) -> dict | None: ...

    def read_config(self) -> dict | None: ...


def interrupted_message(run: RunDirectoryView, overrides: list[str]) -> str:
    """The one line the CLI prints when a run is interrupted (Ctrl-C): the round the run
    directory's checkpoint holds — what ``resume=true`` continues from; the work of an unfinished
    round is lost — and the command that resumes it (``overrides``: the run's command-line
    overrides, whose ``resume`` and ``run_dir`` it replaces)."""
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ("resume", "run_dir")]
    # the interpreter that ran (a venv's python outside an activated venv), so the line works when pasted
    command = " ".join([shlex.quote(sys.executable), "-m fedpriv.simulate", *map(shlex.quote, kept)])
    where = f"run_dir={shlex.quote(str(run.path))}"
    try:
        checkpoint = run.load_checkpoint()
        started = checkpoint is not None or run.read_config() is not None
    except DamagedFileError as err:
        return f"error: interrupted; {err}"
    if checkpoint is not None:
        total = (checkpoint.get("config") or {}).get("rounds", "?")
        return (f"error: interrupted; the last checkpoint is after round {checkpoint['round']} of {total}: "
                f"resume from it with: {command} resume=true {where}")
    if started:  # training had started (config.yaml is written): resume=true starts it again
        return f"error: interrupted before the first checkpoint: start again with: {command} resume=true {where}"
    return f"error: interrupted before training started: start again with: {command} {where}"


def mode_text(privacy: dict) -> str:
    """What every printed epsilon line says about the randomness behind it."""
    randomness = privacy.get("randomness") or {}
    from fedpriv.keys.randomness import RESEARCH_NOTE, mode_label  # lazy: its keystream's cryptography, off the CLIs

    return f"{mode_label(randomness)} mode: {randomness.get('note', RESEARCH_NOTE)}"
