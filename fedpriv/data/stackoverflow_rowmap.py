"""A compact user -> rowid map of a StackOverflow sqlite file without a client index, so that
reading one user is a few rowid B-tree seeks instead of a full-table scan.

Built in one pass at first load (``SELECT rowid, split_name, client_id FROM examples ORDER BY rowid``,
streamed with ``fetchmany``; only one batch of rows is ever in memory) and kept in
``$FEDPRIV_CACHE/stackoverflow/`` (:func:`fedpriv.cache.save_entry`; the data file itself is only
ever opened read-only). The pass records the rowid where each *run* starts: a maximal stretch of
consecutive rows (in rowid order) with one (split_name, client_id). A run ends just before the next
run starts (the last one at the largest rowid), so ``rowid BETWEEN start AND end`` selects exactly
that run's rows even where rowids have gaps. In TFF's file a user's rows are contiguous, so a user is
one run; in a shuffled file a user is many runs (one per row at worst), and the map degrades to
16 bytes per run.

What is kept (numpy int64 arrays, CSR-style; no per-row Python objects):

- the train split's clients in sorted order (code-point order, which is SQLite's BINARY collation
  on UTF-8), with ``offsets[k]:offsets[k + 1]`` indexing their runs' ``starts``/``ends`` (rowid order);
- the test split's maximal runs (adjacent clients merged) with their row counts, so the loader draws
  its seeded test subset without scanning the table (identical to the scan's draw).

Cache identity: the entry is named after the file's resolved path and keyed by (resolved path,
device, inode, size, mtime_ns) plus a format version: any rewrite or replacement of the file
rebuilds the map (and overwrites the entry), and nothing has to be hashed (a content digest of the
full ~30 GB file would cost more than the pass itself). The entry is checked when loaded; a
malformed or unreadable one is ignored and rebuilt.

A well-formed entry under the right key can still be stale (a file rewritten in place keeping its
size and mtime) or poisoned (anyone who can write the cache), and its ranges then point at the
wrong rows: a test run over a user's train rows would publish un-noised test metrics on that
user's training data. So every read filters on the split as well as the rowid range: a train read
on ``split_name = 'train' AND client_id = ?``, a test read on ``split_name = 'test'``. A train read
returns only rows of its own user (perhaps fewer; never one twice: a cached entry
whose runs of one user are not in rowid order and disjoint is refused, as a duplicated example
would be two units of central DP-SGD); a test read that returns fewer
rows than the map counts raises :class:`RowMapMismatch`, and the loader then maps the file again
(refusing, with one line, if the new map does not match either). The extra predicates are written ``+split_name``, which
keeps SQLite on the rowid B-tree whatever other index the file has. The entry lists every train
client id and its rows, so it is written owner-only (0600), and an older world-readable entry is
made owner-only when read.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
import hashlib
import logging
import os
from pathlib import Path
import sqlite3
import time

import numpy as np
import torch

from fedpriv.cache import cache_root, load_entry, save_entry
from fedpriv.data.word_rows import test_subset

logger = logging.getLogger(__name__)
advice = logging.getLogger("fedpriv.advice")  # fedpriv.release.console.ADVICE_LOGGER: on stderr, never among results

FORMAT = "stackoverflow-rowmap-v1"
TRAIN, TEST = "train", "test"
FETCH = 16384  # rows per fetchmany batch: the only rows held in memory during the pass

# ``+column``: the same test, but SQLite uses no index for it, so the rowid range stays the search.
_READ_RUN = (
    "SELECT serialized_example_proto FROM examples WHERE rowid BETWEEN ? AND ?"
    " AND +split_name = ? AND +client_id = ? ORDER BY rowid LIMIT ?"
)
_TEST_RUN_ROWIDS = f"SELECT rowid FROM examples WHERE rowid BETWEEN ? AND ? AND +split_name = '{TEST}' ORDER BY rowid"


class RowMapMismatch(Exception):
    """A read through the map found rows the map does not describe (a stale or poisoned entry)."""


@dataclass(frozen=True, eq=False)
class RowMap:
    """Runs of rows per train client and of the test split (see the module docstring)."""

    train_ids: tuple[str, ...]  # sorted
    offsets: np.ndarray  # int64 [len(train_ids) + 1]
    starts: np.ndarray  # int64 [runs]: first rowid of each train run, grouped by client
    ends: np.ndarray  # int64 [runs]: last rowid (inclusive)
    test_starts: np.ndarray  # int64: maximal runs of the test split, in rowid order
    test_ends: np.ndarray
    test_counts: np.ndarray  # rows in each test run
    rows: int  # rows in the table
    max_rowid: int  # 0 for an empty table

    @property
    def nbytes(self) -> int:
        arrays = (self.offsets, self.starts, self.ends, self.test_starts, self.test_ends, self.test_counts)
        return sum(a.nbytes for a in arrays) + sum(len(c) for c in self.train_ids)

    def user_runs(self, client_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(offsets, starts, ends)`` for ``client_ids`` in that order (a client the map does not
        know has no runs)."""
        k = len(client_ids)
        if tuple(client_ids) == self.train_ids[:k]:  # the loader's own list: a prefix
            end = int(self.offsets[k])
            return self.offsets[: k + 1].copy(), self.starts[:end].copy(), self.ends[:end].copy()
        lo = np.zeros(k, dtype=np.int64)
        lengths = np.zeros(k, dtype=np.int64)
        for j, client in enumerate(client_ids):
            pos = bisect_left(self.train_ids, client)
            if pos < len(self.train_ids) and self.train_ids[pos] == client:
                lo[j] = self.offsets[pos]
                lengths[j] = self.offsets[pos + 1] - self.offsets[pos]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        take = np.repeat(lo - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        return offsets, self.starts[take], self.ends[take]

    def test_rowids(self, conn: sqlite3.Connection, limit: int, seed: int) -> np.ndarray:
        """The rowids ``_test_blobs`` draws from a scan of the test split (up to ``limit``, a seeded
        uniform subset, sorted), computed from the test runs: the same draw, no scan. A run whose
        rowids have gaps is read with one rowid-range query (a seek, not a scan) that must find
        exactly the run's count of test rows (else :class:`RowMapMismatch`). The rowids of a dense
        run are not read here: the caller's read of the rows checks them (``split_name = 'test'``)."""
        cum = np.concatenate([[0], np.cumsum(self.test_counts)]).astype(np.int64)
        n = int(cum[-1])
        positions = test_subset(n, limit, seed)  # positions among the test rows: the scan's draw
        runs = np.searchsorted(cum, positions, side="right") - 1
        within = positions - cum[runs]
        rowids = self.test_starts[runs] + within
        dense = self.test_ends - self.test_starts + 1 == self.test_counts
        for r in np.unique(runs[~dense[runs]]).tolist():
            ids = np.fromiter((row[0] for row in conn.execute(
                _TEST_RUN_ROWIDS, (int(self.test_starts[r]), int(self.test_ends[r])))), dtype=np.int64)
            if len(ids) != self.test_counts[r]:
                raise RowMapMismatch(f"a test run of {self.test_counts[r]} rows holds {len(ids)} test rows")
            mask = runs == r
            rowids[mask] = ids[within[mask]]
        return rowids.astype(np.int64)


def read_user(conn: sqlite3.Connection, client_id: str, starts: np.ndarray, ends: np.ndarray,
              limit: int) -> list[bytes]:
    """``client_id``'s first ``limit`` train examples in rowid order, one rowid-range query per run."""
    blobs: list[bytes] = []
    for start, end in zip(starts.tolist(), ends.tolist()):
        blobs.extend(row[0] for row in conn.execute(_READ_RUN, (start, end, TRAIN, client_id, limit - len(blobs))))
        if len(blobs) >= limit:
            break
    return blobs


# ---------------------------------------------------------------------------------------------
# The one pass
# ---------------------------------------------------------------------------------------------


def build_row_map(conn: sqlite3.Connection) -> RowMap:
    """One streamed pass over ``examples`` in rowid order (see the module docstring)."""
    keys: dict[tuple[str, str], int] = {}
    run_starts, run_firsts, run_keys = array("q"), array("q"), array("q")
    prev_split = prev_client = None
    n = 0
    last_rowid = 0
    cursor = conn.execute("SELECT rowid, split_name, client_id FROM examples ORDER BY rowid")
    while batch := cursor.fetchmany(FETCH):
        for i, (rowid, split, client) in enumerate(batch):
            if client != prev_client or split != prev_split:
                prev_split, prev_client = split, client
                key = keys.setdefault((split, client), len(keys))
                run_starts.append(rowid)
                run_firsts.append(n + i)
                run_keys.append(key)
        n += len(batch)
        last_rowid = batch[-1][0]
    starts = np.frombuffer(run_starts, dtype=np.int64) if run_starts else np.zeros(0, np.int64)
    firsts = np.frombuffer(run_firsts, dtype=np.int64) if run_firsts else np.zeros(0, np.int64)
    codes = np.frombuffer(run_keys, dtype=np.int64) if run_keys else np.zeros(0, np.int64)
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:] - 1
    if len(ends):
        ends[-1] = last_rowid
    counts = np.diff(np.append(firsts, n))
    del firsts, run_firsts

    # Train: runs grouped by client (clients sorted), rowid order within a client.
    train = sorted((client, code) for (split, client), code in keys.items() if split == TRAIN)
    rank = np.full(len(keys), -1, dtype=np.int64)
    rank[[code for _, code in train]] = np.arange(len(train))
    run_rank = rank[codes]
    chosen = np.flatnonzero(run_rank >= 0)
    order = chosen[np.argsort(run_rank[chosen], kind="stable")]
    offsets = np.concatenate([[0], np.cumsum(np.bincount(run_rank[chosen], minlength=len(train)))]).astype(np.int64)
    del run_rank, chosen, rank
    train_starts, train_ends = starts[order], ends[order]  # fancy indexing: copies
    del order

    # Test: maximal runs of the split (adjacent clients merged), with row counts.
    is_test = np.array([split == TEST for split, _ in keys], dtype=bool)[codes] if keys else np.zeros(0, bool)
    test_runs = np.flatnonzero(is_test)
    first = np.ones(len(test_runs), dtype=bool)
    first[1:] = test_runs[1:] != test_runs[:-1] + 1
    last = np.append(first[1:], True) if len(test_runs) else first
    group_first, group_last = test_runs[first], test_runs[last]
    test_counts = (np.add.reduceat(counts[test_runs], np.flatnonzero(first)) if len(test_runs)
                   else np.zeros(0, np.int64))
    return RowMap(
        train_ids=tuple(client for client, _ in train),
        offsets=offsets,
        starts=train_starts,
        ends=train_ends,
        test_starts=starts[group_first],
        test_ends=ends[group_last],
        test_counts=test_counts.astype(np.int64),
        rows=n,
        max_rowid=last_rowid,
    )


# ---------------------------------------------------------------------------------------------
# The cache entry
# ---------------------------------------------------------------------------------------------

_ARRAYS = ("offsets", "starts", "ends", "test_starts", "test_ends", "test_counts")


def _identity(path: Path) -> tuple[str, str]:
    """(the cache key, the entry's path) for the data file ``path`` as it is now."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = f"{FORMAT}|{real}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"
    name = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return key, str(cache_root() / "stackoverflow" / f"rowmap-{name}.pt")


def _to_entry(m: RowMap) -> dict:
    ids = m.train_ids
    return {
        "train_ids": "".join(ids),  # one string and its cut points: fast to (un)pickle
        "train_id_ends": torch.from_numpy(np.cumsum([len(c) for c in ids], dtype=np.int64)),
        **{name: torch.from_numpy(np.ascontiguousarray(getattr(m, name))) for name in _ARRAYS},
        "rows": m.rows,
        "max_rowid": m.max_rowid,
    }


def _from_entry(entry: dict) -> RowMap | None:
    """The map in a loaded entry, or None if anything about it is off (the cache is not trusted)."""
    try:
        joined, cuts = entry["train_ids"], entry["train_id_ends"]
        arrays = {name: entry[name] for name in _ARRAYS}
        rows, max_rowid = entry["rows"], entry["max_rowid"]
        if not (isinstance(joined, str) and isinstance(rows, int) and isinstance(max_rowid, int)):
            return None
        if not all(isinstance(t, torch.Tensor) and t.dtype == torch.int64 and t.dim() == 1
                   for t in (cuts, *arrays.values())):
            return None
        cuts_np = cuts.numpy()
        a = {name: t.numpy() for name, t in arrays.items()}
        k = len(cuts_np)
        if k and (cuts_np[-1] != len(joined) or (np.diff(cuts_np, prepend=0) < 0).any()):
            return None
        if not k and joined:
            return None
        offsets, starts, ends = a["offsets"], a["starts"], a["ends"]
        if (len(offsets) != k + 1 or offsets[0] != 0 or (np.diff(offsets) < 0).any()
                or offsets[-1] != len(starts) or len(ends) != len(starts) or (ends < starts).any()):
            return None
        follows = np.ones(max(len(starts) - 1, 0), dtype=bool)  # run i+1 is the same user's as run i
        firsts = offsets[1:-1]
        follows[firsts[(firsts >= 1) & (firsts < len(starts))] - 1] = False
        if (starts[1:][follows] <= ends[:-1][follows]).any():  # a user's runs in rowid order, disjoint
            return None
        if not len(a["test_starts"]) == len(a["test_ends"]) == len(a["test_counts"]):
            return None
        if ((a["test_ends"] < a["test_starts"]).any() or (a["test_counts"] < 1).any()
                or (a["test_counts"] > a["test_ends"] - a["test_starts"] + 1).any()
                or (a["test_starts"][1:] <= a["test_ends"][:-1]).any()):  # in rowid order, disjoint
            return None
        bounds = np.concatenate([[0], cuts_np]).tolist()
        ids = tuple(joined[bounds[j]:bounds[j + 1]] for j in range(k))
        if any(ids[j] >= ids[j + 1] for j in range(k - 1)):
            return None
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError):
        return None
    return RowMap(train_ids=ids, rows=rows, max_rowid=max_rowid, **a)


def _owner_only(entry_path: Path) -> None:
    """Make an entry an older version left readable by others (0644) owner-only, if it is ours."""
    try:
        if entry_path.stat().st_mode & 0o077:
            entry_path.chmod(0o600)
    except OSError as err:
        logger.warning("could not make %s owner-only: %s", entry_path, err)


def row_map(path: Path, conn: sqlite3.Connection, *, fresh: bool = False) -> RowMap:
    """The map of the file ``path`` (open read-only as ``conn``): from the cache when the file is
    unchanged (unless ``fresh``: the cached one was found not to match), else built in one pass and
    saved there owner-only (unless the file changed during the pass or the cache cannot be written)."""
    key, entry_path = _identity(path)
    entry = None if fresh else load_entry(Path(entry_path), key)
    loaded = _from_entry(entry) if entry is not None else None
    if loaded is not None:
        _owner_only(Path(entry_path))
        top = conn.execute("SELECT MAX(rowid) FROM examples").fetchone()[0] or 0  # a seek: cheap sanity check
        if top == loaded.max_rowid:
            return loaded
    advice.info("%s has no index on examples(client_id): mapping its users to rowid ranges with one pass over the "
                "table, once (the map is cached in $FEDPRIV_CACHE); an indexed copy needs no pass: "
                "python -m fedpriv.data.prepare_stackoverflow %s", path, path)
    began = time.monotonic()
    built = build_row_map(conn)
    if _identity(path)[0] == key:
        try:
            save_entry(Path(entry_path), key, _to_entry(built), private=True)
        except OSError as err:  # a read-only cache: build again next time
            logger.warning("could not save the row map of %s to %s: %s", path, entry_path, err)
    advice.info("mapped %d rows to %d train users' %d row ranges in %.1f s (%.1f MB)", built.rows,
                len(built.train_ids), len(built.starts), time.monotonic() - began, built.nbytes / 1e6)
    return built
