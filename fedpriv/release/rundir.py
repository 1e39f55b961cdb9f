"""The files of one run directory: an exclusive lock, atomic durable writes, checked reads.

``config.yaml`` resolved config · ``metrics.jsonl`` one line per round (only quantities the
epsilon covers, or test-set metrics) · ``diagnostics.jsonl`` (research mode only: statistics of
training users that the epsilon does NOT cover, every line labelled) · ``privacy.json`` the
ledger · ``summary.json`` final metrics + privacy · ``checkpoints/last.pt`` (owner-only; in
secure mode it holds the run key, so it is secret).

* **Lock**: a run holds an exclusive ``flock`` on the directory itself for its whole life; a second
  run, or a second ``resume=true``, on the same directory is refused (:class:`RunDirectoryBusy`)
  and touches nothing. A refused or invalid run removes only what it created: at most the empty
  directory itself and the empty parents that were created for it (Hydra creates the run directory
  with its missing parents; :func:`note_existing` records, before that, which ancestor existed).
  A path that cannot be a directory (a file, under a file, where the file system refuses) is one
  line before Hydra is reached: :func:`make_run_directory` creates it first.
* **Writes**: every file through :func:`fedpriv.release.atomic.write_atomic` (tmp + fsync + rename +
  directory fsync). The run's output sink (:mod:`fedpriv.release.run_outputs`) makes a round's
  checkpoint durable *before* it publishes any output of the round, so a resumed run never redoes
  (and re-releases) a published round.
* **Times** (secure mode): every file and directory of the run directory gets the access and
  modification time :data:`FIXED_TIME` after each round's outputs and after the last write
  (:meth:`RunDirectory.settle_times`), so the files' times do not tell how long training took
  (which depends on the cohorts). The inode change time (ctime) cannot be set by a process: a
  release copies the files (docs/PRIVACY.md).
* **Reads**: a damaged, truncated or foreign file is a :class:`DamagedFileError` naming the file;
  checkpoints load with ``torch.load(weights_only=True)``, which cannot run code from the file.
"""

from __future__ import annotations

import errno
import fcntl
import io
import json
import math
import os
import pickle
import stat
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from fedpriv.release.atomic import write_atomic
from fedpriv.errors import ConfigError, DamagedFileError, OutputError, RunDirectoryBusy

CHECKPOINT_FORMAT = 3
CHECKPOINT_KEYS = ("format", "round", "server", "ledger", "randomness", "history", "diagnostics", "wall_s",
                   "config")
FIXED_TIME = 0  # a secure run's file times (the Unix epoch, as TensorBoard's event times): none is recorded
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"  # written last: its presence means the run finished
CHECKPOINT_FILE = "checkpoints/last.pt"
CLIENT_RELEASES_FILE = "checkpoints/client_releases.json"
DIAGNOSTICS_FILE = "diagnostics.jsonl"
DIAGNOSTICS_NOTE = ("research-only diagnostics of training users: NOT covered by the epsilon of this run, "
                    "not for release")


def short_reason(err: BaseException, limit: int = 160) -> str:
    """``err``'s message as one line of at most ``limit`` characters, for quoting inside an error
    message: whitespace (newlines too) collapsed; a longer one is cut at a word boundary and ends
    with "…", so that what follows the quote stays whole and readable."""
    text = " ".join(str(err).split()) or type(err).__name__
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if " " in cut and not text[limit - 1].isspace():
        cut = cut.rsplit(" ", 1)[0]  # never end inside a word
    return cut.rstrip(" ,;:-") + "…"


def json_safe(value: Any) -> Any:
    """Replace non-finite floats by strings so the output stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def json_text(value: Any, indent: int | None = None) -> str:
    """The one JSON encoding of fedpriv's outputs (files and ``--json`` printouts): strict JSON,
    non-finite floats written by :func:`json_safe`."""
    return json.dumps(json_safe(value), indent=indent, allow_nan=False)


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json_text(r) + "\n" for r in rows).encode()


def write_json(path: str | os.PathLike, value: Any, indent: int | None = 2) -> None:
    """Write ``value`` as :func:`json_text` (plus a final newline) with :func:`write_atomic`."""
    write_atomic(path, (json_text(value, indent) + "\n").encode())


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSON-lines file; a torn or non-JSON line is a :class:`DamagedFileError`."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise DamagedFileError(f"cannot read {path}: {err}") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DamagedFileError(f"{path} is damaged: line {number} is not JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise DamagedFileError(f"{path} is damaged: line {number} is not a JSON object")
        rows.append(row)
    return rows


def read_mapping(path: Path, parse: Callable[[str], Any] = yaml.safe_load) -> dict:
    """A file holding one mapping (config.yaml by default; ``parse=json.loads`` for summary.json);
    unreadable, unparsable or anything but a mapping is a :class:`DamagedFileError` naming it."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise DamagedFileError(f"cannot read {path}: {err}") from None
    try:
        out = parse(text)
    except (ValueError, yaml.YAMLError) as err:  # json.JSONDecodeError is a ValueError
        raise DamagedFileError(f"{path} is damaged: {str(err).splitlines()[0]}") from None
    if not isinstance(out, dict):
        raise DamagedFileError(f"{path} is damaged: it does not hold a mapping")
    return out


# run directory (resolved) -> its nearest ancestor that existed before anything was created for the
# run (see note_existing); abandon() removes the empty directories below that ancestor, never it.
_EXISTING_ANCESTOR: dict[Path, Path] = {}


def note_existing(path: str | os.PathLike) -> None:
    """Record, before anything creates ``path`` (Hydra makes a run directory with its missing
    parents), the nearest of its ancestors that exists, so that :meth:`RunDirectory.abandon`
    can remove the parents made for this run too, and nothing that was there before."""
    path = Path(path).resolve()
    _EXISTING_ANCESTOR[path] = next(p for p in path.parents if _exists(p))


def _exists(path: Path) -> bool:
    try:
        os.stat(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell (no permission): treat it as there, so it is never removed
    return True


def make_run_directory(path: str | os.PathLike, key: str = "run_dir") -> None:
    """Create the run directory ``path`` (the config's ``key``) with its missing parents (what Hydra
    does before a run, with a traceback when it cannot), or raise one line: :class:`ConfigError`
    (bad input, exit 2) when ``path`` or one of its ancestors is a file; :class:`OutputError` (exit
    1) when the file system refuses (no permission, a read-only or virtual file system such as /proc
    or /sys). A failure leaves nothing: the parents this call made are removed again."""
    path = Path(path)
    for place in (path, *path.parents):
        try:
            mode = os.stat(place).st_mode
        except (FileNotFoundError, NotADirectoryError):  # missing, or under a file: look further up
            continue
        except OSError:
            break  # cannot tell (no permission): mkdir says why below
        if not stat.S_ISDIR(mode):
            where = "is a file" if place == path else f"is under {place}, which is a file"
            raise ConfigError(f"{key} {path} {where}, not a directory: choose another {key}")
        break
    made = [p for p in (path, *path.parents) if not _exists(p)]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        for directory in made:  # deepest first; never one that existed
            try:
                directory.rmdir()
            except OSError:
                pass
        if err.errno in (errno.ENOTDIR, errno.EEXIST):  # a file appeared meanwhile
            raise ConfigError(f"{key} {path} is not a directory ({err.strerror}): choose another {key}") from None
        raise OutputError(f"cannot create the directory {path} ({key}): {err.strerror or err} (choose a {key} on a "
                          "writable file system)") from None


class RunDirectory:
    """Reads and writes the outputs of one run; ``lock()`` before writing anything."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.created = False  # this process created the directory (so it may remove it if left empty)
        self._lock_fd: int | None = None

    # ------------------------------------------------------------ lock

    def lock(self) -> "RunDirectory":
        """Take the directory's exclusive lock (creating the directory if needed), or raise
        :class:`RunDirectoryBusy` without touching anything."""
        if self._lock_fd is not None:
            return self
        existed = self.path.exists()
        for _ in range(3):
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            except OSError as err:
                raise RunDirectoryBusy(f"cannot use run directory {self.path}: {err.strerror or err}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise RunDirectoryBusy(f"run directory {self.path} is in use by another fedpriv run (it holds the "
                                       "directory's lock): wait for it to finish, or use another run_dir") from None
            mine, there = os.fstat(fd), self._stat()
            if there is not None and (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
                break
            os.close(fd)  # the directory was removed (and maybe recreated) between open and lock: again
        else:
            raise RunDirectoryBusy(f"run directory {self.path} keeps being removed and recreated: use another run_dir")
        self._lock_fd = fd
        self.created = self.created or not existed
        return self

    def _stat(self) -> os.stat_result | None:
        try:
            return os.stat(self.path)
        except OSError:
            return None

    @property
    def locked(self) -> bool:
        return self._lock_fd is not None

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def abandon(self) -> None:
        """A run that stops before writing anything: remove the directory if this process created
        it and it is still empty (never anything inside it), and then the parents created for it
        (those below the ancestor :func:`note_existing` found, while they are empty); then release
        the lock."""
        if self.created and self.locked:
            try:
                self.path.rmdir()
            except OSError:
                pass  # not empty: leave it
            else:
                self._remove_created_parents()
        self.unlock()

    def _remove_created_parents(self) -> None:
        path = self.path.resolve()
        existing = _EXISTING_ANCESTOR.get(path)
        if existing is None:
            return  # nothing recorded: only the directory itself is known to be this run's
        for parent in path.parents:
            if parent == existing or existing not in parent.parents:
                return
            try:
                parent.rmdir()
            except OSError:
                return  # not empty (another run's directory, a user's file): leave it and those above

    def __del__(self) -> None:
        self.unlock()

    # ------------------------------------------------------------ paths

    @property
    def checkpoint_path(self) -> Path:
        return self.path / CHECKPOINT_FILE

    @property
    def client_releases_path(self) -> Path:
        return self.path / CLIENT_RELEASES_FILE

    # ------------------------------------------------------------ writes

    def write_json(self, name: str, obj: dict) -> None:
        write_json(self.path / name, obj)

    def write_config(self, cfg: dict) -> None:
        write_atomic(self.path / CONFIG_FILE, yaml.safe_dump(cfg, sort_keys=False).encode())

    def write_metrics(self, rows: list[dict]) -> None:
        """Rewrite ``metrics.jsonl`` with ``rows`` (all rounds so far: one atomic file, never torn)."""
        write_atomic(self.path / METRICS_FILE, jsonl(rows))

    def write_diagnostics(self, rows: list[dict]) -> None:
        """Rewrite ``diagnostics.jsonl``; every line carries :data:`DIAGNOSTICS_NOTE`."""
        write_atomic(self.path / DIAGNOSTICS_FILE, jsonl([{"note": DIAGNOSTICS_NOTE, **r} for r in rows]))

    def _private_directory(self) -> None:
        """``checkpoints/``, owner-only (0700) even if it existed with wider modes."""
        directory = self.checkpoint_path.parent
        directory.mkdir(mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)

    def save_checkpoint(self, state: dict) -> None:
        """Write ``checkpoints/last.pt`` owner-only (directory 0700), atomically and durably."""
        self._private_directory()
        buffer = io.BytesIO()
        torch.save(state, buffer)
        write_atomic(self.checkpoint_path, buffer.getvalue(), private=True)

    def save_client_releases(self, count: int) -> None:
        """Record, durably and before clients are asked, that ``count`` rounds of their
        example-level DP replies may have reached the server (a round asked again after a crash
        counts again: in secure mode its clients draw fresh noise)."""
        self._private_directory()
        write_atomic(self.client_releases_path, json.dumps({"client_releases": int(count)}).encode(), private=True)

    def settle_times(self) -> None:
        """Set the access and modification times of the run directory, and of everything below it,
        to :data:`FIXED_TIME` (symbolic links themselves, never their targets). A secure run calls
        it after each round's outputs and after its last write (module docstring, "Times")."""
        paths = [os.path.join(root, name) for root, dirs, files in os.walk(self.path) for name in dirs + files]
        unsettled = []
        for path in [*paths, self.path]:  # the directory last: nothing changes it after
            try:
                os.utime(path, (FIXED_TIME, FIXED_TIME), follow_symlinks=False)
            except FileNotFoundError:
                pass  # a temporary file renamed away meanwhile (or a directory removed under a failed run)
            except OSError as err:  # e.g. another user's file: never masks the run's own outcome
                unsettled.append(f"{path} ({err.strerror})")
        if unsettled:
            warnings.warn(f"could not set the times of {len(unsettled)} path(s) in the run directory, which "
                          f"therefore show when they were written: {', '.join(unsettled[:3])}", stacklevel=2)

    # ------------------------------------------------------------ reads

    def read_client_releases(self) -> int:
        """What :meth:`save_client_releases` last recorded (0 if nothing)."""
        path = self.client_releases_path
        if not path.exists():
            return 0
        try:
            count = json.loads(path.read_text())["client_releases"]
        except (ValueError, KeyError, TypeError):
            count = None
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise DamagedFileError(f"{path} is damaged (it counts the rounds clients replied in)")
        return count

    def read_config(self) -> dict | None:
        path = self.path / CONFIG_FILE
        return read_mapping(path) if path.exists() else None

    def read_metrics(self) -> list[dict]:
        path = self.path / METRICS_FILE
        return read_jsonl(path) if path.exists() else []

    def load_checkpoint(self) -> dict | None:
        """The checkpoint, or None if there is none; :class:`DamagedFileError` naming the file if
        it cannot be read, is not a fedpriv checkpoint, or would need code to unpickle."""
        path = self.checkpoint_path
        if not path.exists():
            return None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # e.g. torch's note on a foreign pickle protocol
                state = torch.load(io.BytesIO(path.read_bytes()), weights_only=True)
        except pickle.UnpicklingError as err:
            if "Weights only load failed" in str(err):
                reason = "it holds objects other than plain data; refused, since loading them could run code"
            else:
                reason = short_reason(err)
            raise DamagedFileError(f"checkpoint {path} is damaged or was not written by fedpriv ({reason})") from None
        except Exception as err:  # truncated or corrupt
            raise DamagedFileError(f"checkpoint {path} is damaged or was not written by fedpriv "
                                   f"({short_reason(err)})") from None
        if not isinstance(state, dict) or any(k not in state for k in CHECKPOINT_KEYS):
            raise DamagedFileError(f"checkpoint {path} is damaged or was not written by fedpriv (missing fields)")
        if state["format"] != CHECKPOINT_FORMAT:
            raise DamagedFileError(f"checkpoint {path} has format {state['format']!r}, this fedpriv reads "
                                   f"format {CHECKPOINT_FORMAT} (resume it with the fedpriv that wrote it, or start "
                                   "a new run)")
        return state
