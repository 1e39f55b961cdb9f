"""The one way fedpriv writes a file: all or nothing, durable before it is visible.

``write_atomic(path, data)`` writes ``data`` to a temporary file in the same directory, flushes
and ``fsync``s it, renames it over ``path`` (``os.replace``: readers see the old file or the new
one, never half) and ``fsync``s the directory so the rename survives a power cut. With
``private=True`` the file is created owner-only (0600) before any byte is written (checkpoints,
which hold the run key in secure mode). A failure removes the temporary file and leaves the old
``path`` untouched; a full disk raises :class:`~fedpriv.errors.OutputError` with one clear line.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from fedpriv.errors import OutputError

_FULL = (errno.ENOSPC, errno.EDQUOT)


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, data: bytes, private: bool = False) -> None:
    """Replace ``path`` by ``data`` atomically and durably (see the module docstring)."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise _output_error(path, err) from None
    try:
        if not private:
            os.fchmod(fd, 0o644 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise _output_error(path, err) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _output_error(path: Path, err: OSError) -> OutputError:
    if err.errno in _FULL:
        return OutputError(f"no space left on the device while writing {path}; the previous version of the file "
                           "is intact (free some space, then resume)")
    return OutputError(f"cannot write {path}: {err.strerror or err}")
