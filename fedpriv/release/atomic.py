"""The one way fedpriv writes a file: all or nothing, durable before it is visible.

``write_atomic(path, data)`` writes ``data`` to a temporary file in the same directory, flushes
and ``fsync``s it, renames it over ``path`` (``os.replace``: readers see the old file or the new
one, never half) and ``fsync``s the directory so the rename survives a power cut. The temporary
file is created with its final mode in the one ``open`` call that makes it (``O_CREAT | O_EXCL``,
mode 0644, or owner-only 0600 with ``private=True``: checkpoints, which hold the run key in secure
mode), which the kernel masks with the process umask; the umask itself is never read or changed
(changing it, even briefly, would hand another thread's new files permissive modes). A failure
removes the temporary file and leaves the old ``path`` untouched; a full disk raises
:class:`~fedpriv.errors.OutputError` with one clear line.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from fedpriv.errors import OutputError

_FULL = (errno.ENOSPC, errno.EDQUOT)


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_temporary(path: Path, mode: int) -> tuple[int, Path]:
    """A new, empty, exclusively created file beside ``path`` with ``mode`` (masked by the umask)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue  # another writer's temporary file (64 random bits: practically never)


def write_atomic(path: str | os.PathLike, data: bytes, private: bool = False) -> None:
    """Replace ``path`` by ``data`` atomically and durably (see the module docstring)."""
    path = Path(path)
    try:
        fd, tmp = _create_temporary(path, 0o600 if private else 0o644)
    except OSError as err:
        raise _output_error(path, err) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise _output_error(path, err) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def create_atomic(path: str | os.PathLike, fill: Callable[[Path], None], mode: int = 0o644) -> None:
    """Create ``path``, which must not exist, from the file ``fill(tmp)`` writes at a temporary
    path beside it — for outputs too large to hold in memory (a database copy). The file is
    ``fsync``ed, then published with a hard link, which never replaces a file that appeared
    meanwhile (``FileExistsError``), and the directory ``fsync``ed. Any failure removes the
    temporary file (``fill`` removes what else it creates)."""
    path = Path(path)
    fd, tmp = _create_temporary(path, mode)
    os.close(fd)
    try:
        fill(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.link(tmp, path)
        fsync_directory(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def create_bytes_atomic(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> None:
    """:func:`create_atomic` of a file holding ``data``: created whole or not at all, never
    replacing a file (``FileExistsError``)."""
    create_atomic(path, lambda tmp: tmp.write_bytes(data), mode)


def _output_error(path: Path, err: OSError) -> OutputError:
    if err.errno in _FULL:
        return OutputError(f"no space left on the device while writing {path}; the previous version of the file "
                           "is intact (free some space, then resume)")
    return OutputError(f"cannot write {path}: {err.strerror or err}")
