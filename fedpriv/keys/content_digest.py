"""The identity of an input by its content, not its location: what the research key covers for a
config field that names a file (``schema.LOCATION``).

``identity(path)`` is ``{"bytes": n, "sha256": hex}`` for a file; for a directory or a glob it is
the same over the sorted relative names and contents of every file it holds (``"files"`` counts
them), so the same data at two paths, behind a hard link or copied to a collaborator's machine,
has one identity, and changed content has another. Hashing a multi-GB file takes seconds, so a
digest is computed once and cached (in memory and under ``$FEDPRIV_CACHE/digests``), keyed by the
file's device, inode, size and modification time: a file rewritten in place is hashed again.
"""

from __future__ import annotations

import glob as globbing
import hashlib
import os
from pathlib import Path

from fedpriv.cache import cache_root, load_entry, save_entry

CHUNK = 1 << 22
_MEMORY: dict[str, str] = {}


def _stat_key(path: Path) -> str:
    st = path.stat()
    return f"{os.path.realpath(path)}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 of the file's bytes (hex), cached by its stat (see the module docstring)."""
    path = Path(path)
    key = _stat_key(path)
    if key in _MEMORY:
        return _MEMORY[key]
    entry_path = cache_root() / "digests" / (hashlib.sha256(key.encode()).hexdigest() + ".pt")
    entry = load_entry(entry_path, key)
    if entry is not None and isinstance(entry.get("sha256"), str):
        digest = entry["sha256"]
    else:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        digest = h.hexdigest()
        try:
            save_entry(entry_path, key, {"sha256": digest})
        except OSError:  # a read-only cache: hash again next time
            pass
    _MEMORY[key] = digest
    return digest


def files_of(path: str) -> tuple[Path, list[Path]] | None:
    """The root and the sorted files that ``path`` names (a file; a directory: every file under it,
    recursively; or a glob), or None where it names none. The one expansion of a path into files:
    what the research key hashes is what ``data=files`` reads (:mod:`fedpriv.data.files_source`)."""
    p = Path(path).expanduser()
    if p.is_file():
        return p.parent, [p]
    if p.is_dir():
        return p, sorted(q for q in p.rglob("*") if q.is_file())
    matches = sorted(Path(m) for m in globbing.glob(str(p), recursive=True) if Path(m).is_file())
    if matches:
        return Path(os.path.commonpath([m.parent for m in matches])), matches
    return None


def identity(path: str | None) -> dict | None:
    """The content identity of the input at ``path`` (None stays None; a path naming nothing is
    ``{"missing": true}``: the run that reads it fails with its own message)."""
    if path is None:
        return None
    found = files_of(str(path))
    if found is None:
        return {"missing": True}
    root, files = found
    if len(files) == 1 and Path(path).expanduser().is_file():
        return {"bytes": files[0].stat().st_size, "sha256": file_digest(files[0])}
    h = hashlib.sha256()
    total = 0
    for f in files:
        h.update(f"{f.relative_to(root).as_posix()}\0{file_digest(f)}\n".encode())
        total += f.stat().st_size
    return {"files": len(files), "bytes": total, "sha256": h.hexdigest()}
