"""The per-user index of a ``data=files`` table, and the public rule that holds users out for the
test set.

**Index** (:func:`user_index`). Rows come in no particular order (an export is rarely grouped by
user). The index maps each user to the positions of its rows in ``FilesSource.train``, in file
order, with 4 bytes per indexed row and 8 per user, built from the user column alone (never the
text), :data:`~fedpriv.data.files_source.STEP` rows at a time, in three vectorised passes:

1. the distinct ids (``pyarrow.compute.unique`` per slice, merged), sorted: code-point order for
   string ids (UTF-8 byte order), numeric order for integer ids — the order of Flower Datasets'
   ``NaturalIdPartitioner`` (``sorted(dataset.unique(column))``), so a user's number here is its
   partition id there;
2. each row's user number (``index_in`` the sorted ids) into a temporary memory-mapped array, and
   the rows per user;
3. a stable counting sort of the row positions by user number into ``order``: user ``u``'s rows
   are ``order[offsets[u]:offsets[u + 1]]``, ascending (file order within a user).

Under a split column only the ``train`` rows are indexed and the positions of the ``test`` rows are
kept as ``test_rows``; under a ``DatasetDict`` its ``train`` split is indexed; with neither, every
row is indexed and :func:`split_of` picks the test users.

The index is stored as ``.npy`` files (memory-mapped when loaded) in ``index-<columns>/`` of the
source's cache entry, keyed by the content of the files and the three columns: built in a temporary
directory and renamed in, owner-only (0700/0600: it lists every user id), and checked when loaded
— key, dtypes, shapes, offsets increasing from 0 to the rows indexed, every position in range and
used at most once across ``order`` and ``test_rows``, ids strictly increasing — else rebuilt. The
check cannot see an index that is well-formed but wrong (a poisoned cache): a reader of a user's
rows must still check that every row read holds that user's id (and the split), as the StackOverflow
row map's readers do.

**Test split** (:func:`split_of`): without a split column, user ``u`` is a test user iff
``BLAKE2b(id_bytes(u), key=TEST_SPLIT_KEY, salt=split_seed as 16 bytes little-endian, 8-byte
digest)``, read as a little-endian integer, is below ``test_fraction · 2⁶⁴``. The rule is public and
depends on nothing in the data: a user's side is a function of its own id, so adding or removing a
user moves no other user between train and test, and raising ``test_fraction`` only moves users
into the test set. It is the same in research and secure mode (never the run key: a secret split,
new on each run, would train in one run on a user tested un-noised in another).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fedpriv.release.atomic import write_atomic
import fedpriv.data.files_source as files_source
from fedpriv.data.files_source import TEST, TRAIN, FilesSource, make_private, publish_dir, temporary_dir
from fedpriv.errors import ConfigError, OutputError
from fedpriv.release.rundir import short_reason

FORMAT = "fedpriv-files-index-v1"
TEST_SPLIT_KEY = b"fedpriv/data=files/test-split/v1"
_SALT_BYTES = 16  # BLAKE2b's salt


@dataclass(frozen=True, eq=False)
class UserIndex:
    """Users of ``FilesSource.train`` and their rows (see the module docstring)."""

    ids: pa.Array  # sorted user ids: large_string or int64
    offsets: np.ndarray  # int64 [users + 1]
    order: np.ndarray  # int32 (int64 past 2^31 rows) [indexed rows]: positions, grouped by user
    test_rows: np.ndarray | None  # int64, ascending: the split column's 'test' rows; None without one
    rows: int  # rows of FilesSource.train
    path: Path  # the index's directory in the cache entry
    built_seconds: float | None = None  # time this call spent building it (None: found in the cache)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def rows_of(self, user: int) -> np.ndarray:
        """Positions (in ``FilesSource.train``) of user number ``user``'s indexed rows, ascending."""
        return self.order[self.offsets[user]:self.offsets[user + 1]]

    def id_of(self, user: int) -> str | int:
        return self.ids[user].as_py()

    def number_of(self, user_id: str | int) -> int | None:
        """The number of the user with id ``user_id`` (binary search), or None if it has no row."""
        lo, hi = 0, len(self)
        string = pa.types.is_large_string(self.ids.type)
        if string != isinstance(user_id, str) or isinstance(user_id, bool):
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if self.ids[mid].as_py() < user_id:
                lo = mid + 1
            else:
                hi = mid
        return lo if lo < len(self) and self.ids[lo].as_py() == user_id else None


# ---------------------------------------------------------------------------------------------
# The public test split
# ---------------------------------------------------------------------------------------------


def id_bytes(user_id: str | int) -> bytes:
    """What the split rule hashes: the UTF-8 of a string id, the ASCII decimal of an integer id
    (so the ids ``123`` and ``"123"`` are split alike)."""
    if isinstance(user_id, str):
        return user_id.encode("utf-8")
    if isinstance(user_id, (int, np.integer)) and not isinstance(user_id, (bool, np.bool_)):
        return str(int(user_id)).encode("ascii")
    raise ConfigError(f"a user id must be a string or an integer, got {type(user_id).__name__} {user_id!r}")


def split_of(ids: Sequence[str | int] | Iterable[str | int] | pa.Array | pa.ChunkedArray, test_fraction: float,
             split_seed: int) -> np.ndarray:
    """Bool per id: True for a test user (the module docstring's rule; ``0 <= test_fraction <= 1``,
    ``0 <= split_seed < 2^128``)."""
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not (
            0.0 <= float(test_fraction) <= 1.0):
        raise ConfigError(f"data.test_fraction must be a number in [0, 1], got {test_fraction!r}")
    if isinstance(split_seed, bool) or not isinstance(split_seed, (int, np.integer)) or not (
            0 <= int(split_seed) < 1 << (8 * _SALT_BYTES)):
        raise ConfigError(f"data.split_seed must be an integer in [0, 2^128), got {split_seed!r}")
    if isinstance(ids, (pa.Array, pa.ChunkedArray)):
        ids = ids.to_pylist()
    base = hashlib.blake2b(key=TEST_SPLIT_KEY, salt=int(split_seed).to_bytes(_SALT_BYTES, "little"), digest_size=8)

    def word(user_id: str | int) -> int:
        h = base.copy()  # the keyed state: equal to hashing with key= and salt= afresh
        h.update(id_bytes(user_id))
        return int.from_bytes(h.digest(), "little")

    words = np.fromiter((word(u) for u in ids), dtype=np.uint64)
    threshold = math.ceil(float(test_fraction) * 2.0 ** 64)  # exact: word < f·2^64 iff word < ⌈f·2^64⌉
    if threshold >= 1 << 64:
        return np.ones(len(words), dtype=bool)
    return words < np.uint64(threshold)


# ---------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------


def _id_type(arrow_type: pa.DataType) -> pa.DataType:
    return pa.int64() if pa.types.is_integer(arrow_type) else pa.large_string()


def _train_slices(ds, user: str, split: str | None):
    """(first row, the slice's ids cast to the index's id type, its train mask or None, its test mask or None)."""
    id_type = _id_type(ds.data.schema.field(user).type)
    splits = files_source.column_slices(ds, split) if split is not None else None
    for start, ids in files_source.column_slices(ds, user):
        try:
            ids = ids.cast(id_type)
        except pa.ArrowInvalid as err:  # an unsigned id past 2^63
            raise ConfigError(f"data.user_column {user!r}: an integer user id does not fit 64 signed bits "
                              f"({short_reason(err)})") from None
        train = test = None
        if splits is not None:
            names = next(splits)[1]
            train, test = (pc.fill_null(pc.equal(names, TRAIN), False), pc.fill_null(pc.equal(names, TEST), False))
        if ids.null_count and (train is None or pc.any(pc.and_(pc.is_null(ids), train)).as_py()):
            raise ConfigError(f"data.user_column {user!r} has train rows without a user id")
        yield start, ids, train, test


def build(ds, user: str, split: str | None, out: Path) -> dict:
    """Write the index of ``ds`` (by ``user``; only the ``train`` rows of ``split`` if given) into
    the directory ``out`` (module docstring: three passes over the user column); its facts."""
    rows = ds.data.num_rows
    # pass 1: the distinct ids, sorted
    parts = [pc.unique(pc.filter(ids, train) if train is not None else ids)
             for _, ids, train, _ in _train_slices(ds, user, split)]
    merged = pc.unique(pa.concat_arrays(parts)) if parts else pa.array([], _id_type(ds.data.schema.field(user).type))
    del parts
    ids = merged.take(pc.array_sort_indices(merged))
    users = len(ids)
    if users == 0:
        raise ConfigError(f"no row has data.split_column {split!r} = 'train'" if split else "the data has no rows")
    # pass 2: each row's user number (-1: not indexed), and rows per user
    codes = np.lib.format.open_memmap(out / "codes.npy", mode="w+", dtype=np.int32, shape=(rows,))
    counts = np.zeros(users, dtype=np.int64)
    tests: list[np.ndarray] = []
    for start, slice_ids, train, test in _train_slices(ds, user, split):
        number = pc.index_in(slice_ids, value_set=ids)
        if train is not None:
            number = pc.if_else(train, number, None)
            tests.append(np.flatnonzero(test.to_numpy(zero_copy_only=False)).astype(np.int64) + start)
        c = pc.fill_null(number, -1).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        codes[start:start + len(c)] = c
        counts += np.bincount(c[c >= 0], minlength=users)
    offsets = np.zeros(users + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    indexed = int(offsets[-1])
    # pass 3: stable counting sort of the row positions by user number
    order = np.lib.format.open_memmap(out / "order.npy", mode="w+", dtype=np.int32 if rows < 2 ** 31 else np.int64,
                                      shape=(indexed,))
    nxt = offsets[:-1].copy()  # where each user's next row goes
    for start in range(0, rows, files_source.STEP):
        c = np.asarray(codes[start:start + files_source.STEP])
        positions = np.flatnonzero(c >= 0)
        c = c[positions]
        by_user = np.argsort(c, kind="stable")
        sc = c[by_user]
        run_first = np.ones(len(sc), dtype=bool)
        run_first[1:] = sc[1:] != sc[:-1]
        rank = np.arange(len(sc)) - np.maximum.accumulate(np.where(run_first, np.arange(len(sc)), 0))
        order[nxt[sc] + rank] = positions[by_user] + start
        nxt += np.bincount(c, minlength=users)
    order.flush()
    del order, codes
    (out / "codes.npy").unlink()
    np.save(out / "offsets.npy", offsets)
    if pa.types.is_integer(ids.type):
        np.save(out / "ids.npy", ids.to_numpy())
        kind = "int64"
    else:
        _, id_offsets, data = ids.buffers()
        ends = np.frombuffer(id_offsets, dtype=np.int64)[ids.offset:ids.offset + users + 1]
        np.save(out / "id_offsets.npy", ends - ends[0])
        np.save(out / "id_data.npy", np.frombuffer(data, dtype=np.uint8)[ends[0]:ends[-1]])
        kind = "string"
    test_rows = None
    if split is not None:
        test_rows = np.concatenate(tests) if tests else np.zeros(0, np.int64)
        np.save(out / "test_rows.npy", test_rows)
    return {"rows": rows, "users": users, "indexed": indexed, "ids": kind,
            "test_rows": None if test_rows is None else len(test_rows)}


# ---------------------------------------------------------------------------------------------
# Loading (and checking) an entry
# ---------------------------------------------------------------------------------------------


def _array(path: Path, dtype, shape: tuple[int, ...]) -> np.ndarray:
    a = np.load(path, mmap_mode="r" if int(np.prod(shape)) else None, allow_pickle=False)
    if a.dtype != dtype or a.shape != shape:
        raise ValueError(f"{path.name}: {a.dtype}{a.shape}, not {np.dtype(dtype)}{shape}")
    return a


def load(directory: Path, key: str, rows: int, split: str | None) -> UserIndex | None:
    """The index stored in ``directory`` for the entry ``key`` over ``rows`` rows, or None if it is
    missing or anything about it is off (module docstring)."""
    try:
        meta = json.loads((directory / "meta.json").read_text())
        if meta.get("format") != FORMAT or meta.get("key") != key or meta.get("rows") != rows:
            return None
        users, indexed, kind = meta["users"], meta["indexed"], meta["ids"]
        if not (isinstance(users, int) and isinstance(indexed, int) and 1 <= users <= indexed <= rows):
            return None
        offsets = _array(directory / "offsets.npy", np.int64, (users + 1,))
        order = np.load(directory / "order.npy", mmap_mode="r", allow_pickle=False)
        if order.dtype not in (np.int32, np.int64) or order.shape != (indexed,):
            return None
        diffs = np.diff(offsets)
        if offsets[0] != 0 or offsets[-1] != indexed or not (diffs > 0).all():
            return None
        if kind == "int64":
            ids = pa.array(_array(directory / "ids.npy", np.int64, (users,)))
            if users > 1 and not (np.diff(ids.to_numpy()) > 0).all():
                return None
        elif kind == "string":
            ends = _array(directory / "id_offsets.npy", np.int64, (users + 1,))
            data = np.load(directory / "id_data.npy", mmap_mode="r", allow_pickle=False)
            if data.dtype != np.uint8 or data.ndim != 1 or ends[0] != 0 or ends[-1] != len(data) or (
                    np.diff(ends) < 0).any():
                return None
            ids = pa.LargeStringArray.from_buffers(users, pa.py_buffer(np.ascontiguousarray(ends)),
                                                   pa.py_buffer(data))
            ids.validate(full=True)  # UTF-8
            if users > 1 and not pc.all(pc.less(ids.slice(0, users - 1), ids.slice(1))).as_py():
                return None
        else:
            return None
        test_rows = None
        if split is not None:
            n = meta.get("test_rows")
            if not isinstance(n, int) or n < 0:
                return None
            test_rows = _array(directory / "test_rows.npy", np.int64, (n,))
        elif meta.get("test_rows") is not None:
            return None
        seen = np.zeros(rows, dtype=bool)  # every position in range, and used once
        for positions in (order, test_rows):
            if positions is None or not len(positions):
                continue
            p = np.asarray(positions)
            if p.min() < 0 or p.max() >= rows or seen[p].any():
                return None
            seen[p] = True
            if positions is test_rows and not (np.diff(p) > 0).all():
                return None
        if int(seen.sum()) != indexed + (0 if test_rows is None else len(test_rows)):
            return None  # a position twice
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowInvalid):
        return None
    return UserIndex(ids=ids, offsets=offsets, order=order, test_rows=test_rows, rows=rows, path=directory)


def user_index(source: FilesSource) -> UserIndex:
    """The index of ``source.train`` (see the module docstring): from the cache entry when it is
    there and sound, else built (seconds per million rows) and stored there."""
    directory = source.entry / f"index-{source.columns_key[:16]}"
    split = source.split_column if source.split == "column" else None
    rows = source.train.data.num_rows
    found = load(directory, source.columns_key, rows, split)
    if found is not None:
        return found
    began = time.monotonic()
    tmp = temporary_dir(source.entry, "index")
    try:
        try:
            facts = build(source.train, source.user_column, split, tmp)
            write_atomic(tmp / "meta.json", json.dumps({"format": FORMAT, "key": source.columns_key, **facts}).encode(),
                         private=True)
            make_private(tmp)
        except OSError as err:
            raise OutputError(f"cannot write the data index in {source.entry} ({short_reason(err)})") from None
        publish_dir(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    found = load(directory, source.columns_key, rows, split)
    if found is None:
        raise OutputError(f"the data index {directory} was written but does not read back")
    return replace(found, built_seconds=time.monotonic() - began)
