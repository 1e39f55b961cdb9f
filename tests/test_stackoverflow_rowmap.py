"""The user -> rowid-range map of a StackOverflow file without a client index
(fedpriv/data/stackoverflow_rowmap.py): same users and rows as the indexed path, cached by the
file's identity, never writing the data file, a corrupt cache entry rebuilt, a stale or poisoned one
unable to put train rows in the test set, the entry owner-only."""

from __future__ import annotations

from contextlib import closing
import dataclasses
import os
import pickle
import random
import sqlite3
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from fedpriv.cache import save_entry
from fedpriv.data import stackoverflow, stackoverflow_rowmap
from fedpriv.data.stackoverflow import load_stackoverflow
from fedpriv.data.stackoverflow_writer import write_examples
from fedpriv.errors import ConfigError

WORDS = ["i", "how", "to", "a", "list", "sort", "do", "it", "in", "python"]
WORD_COUNTS = "".join(f"{w}\t{100 - k}\n" for k, w in enumerate(WORDS))


def _rows(seed: int = 0) -> list[tuple[str, str, str]]:
    """(split, client, tokens) grouped by client (TFF's layout), clients in no sorted order; every
    sentence distinct, so equal arrays mean equal rows."""
    rng = random.Random(seed)
    groups = []
    clients = [("train", f"u{k}", 1 + (k * 7) % 13) for k in range(40)]
    clients += [("test", f"t{k}", 1 + k % 5) for k in range(12)] + [("heldout", f"h{k}", 3) for k in range(4)]
    clients += [("test", "u3", 4)]  # a train user with test rows too
    rng.shuffle(clients)
    n = 0
    for split, client, count in clients:
        group = []
        for _ in range(count):
            group.append((split, client, f"{WORDS[n % 10]} {WORDS[(n // 10) % 10]} {WORDS[(n // 100) % 10]} w{n}"))
            n += 1
        groups.append(group)
    return [row for group in groups for row in group]


def _write(directory: Path, rows, **kwargs) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "stackoverflow.word_count").write_text(WORD_COUNTS)
    return write_examples(directory / "stackoverflow.sqlite", rows, **kwargs)


def _load(path: Path, **kwargs):
    return load_stackoverflow(path, **{"vocab_size": 8, "seq_len": 5, "max_test_sentences": 20, **kwargs})


def _same(a, b) -> None:
    assert a.users.client_ids == b.users.client_ids
    for u in range(len(a.users)):
        np.testing.assert_array_equal(a.users[u], b.users[u])
    np.testing.assert_array_equal(a.test, b.test)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the passes over the table."""
    calls: list[int] = []
    real = stackoverflow_rowmap.build_row_map

    def counting(conn):
        calls.append(1)
        return real(conn)

    monkeypatch.setattr(stackoverflow_rowmap, "build_row_map", counting)
    return calls


CAPPED = {"max_sentences_per_user": 3, "max_users": 25, "max_test_sentences": 7, "seed": 5}


@pytest.mark.parametrize("layout", ["contiguous", "shuffled", "gaps", "metadata"])
@pytest.mark.parametrize("kwargs", [{}, CAPPED])
def test_map_reads_the_same_users_and_rows_as_the_index(tmp_path: Path, cache: Path, layout: str, kwargs) -> None:
    rows = _rows()
    if layout in ("shuffled", "gaps"):
        random.Random(1).shuffle(rows)
    plain = _write(tmp_path / "plain", rows, metadata=layout == "metadata")
    indexed = _write(tmp_path / "indexed", rows, index=True)
    if layout == "gaps":  # deleted rows: rowid ranges with holes (the same rows removed from both)
        for path in (plain, indexed):
            with sqlite3.connect(path) as con:
                con.execute("DELETE FROM examples WHERE rowid % 5 = 0")
    by_map, by_index = _load(plain, **kwargs), _load(indexed, **kwargs)
    assert by_map.info["row_map"] is True and by_map.info["client_index"] is False
    assert by_index.info["row_map"] is False and by_index.info["client_index"] is True
    assert by_map.users.runs is not None and by_index.users.runs is None
    _same(by_map, by_index)
    assert len(by_map.users) == kwargs.get("max_users", 39 if layout == "gaps" else 40)  # gaps: one user deleted
    clone = pickle.loads(pickle.dumps(by_map.users))  # the map travels to worker processes
    for u in range(len(clone)):
        np.testing.assert_array_equal(clone[u], by_index.users[u])


def test_runs_are_ranges_not_rows(tmp_path: Path, cache: Path) -> None:
    rows = _rows()
    with sqlite3.connect(_write(tmp_path / "a", rows)) as conn:
        contiguous = stackoverflow_rowmap.build_row_map(conn)
    assert len(contiguous.starts) == 40  # one range per train user
    assert len(contiguous.test_starts) <= 13 and contiguous.test_counts.sum() == sum(r[0] == "test" for r in rows)
    assert contiguous.rows == len(rows) == contiguous.max_rowid
    random.Random(1).shuffle(rows)
    with sqlite3.connect(_write(tmp_path / "b", rows)) as conn:
        shuffled = stackoverflow_rowmap.build_row_map(conn)
    assert len(contiguous.starts) < len(shuffled.starts) <= sum(r[0] == "train" for r in rows)
    assert shuffled.train_ids == contiguous.train_ids == tuple(sorted(contiguous.train_ids))
    # A list of clients not from the map (client_metadata): looked up one by one, unknown ones empty.
    offsets, starts, ends = shuffled.user_runs(["u3", "nobody", "u1"])
    k3, k1 = shuffled.train_ids.index("u3"), shuffled.train_ids.index("u1")
    assert offsets.tolist() == [0, shuffled.offsets[k3 + 1] - shuffled.offsets[k3], offsets[1],
                                offsets[1] + shuffled.offsets[k1 + 1] - shuffled.offsets[k1]]
    np.testing.assert_array_equal(starts[offsets[2]:], shuffled.starts[shuffled.offsets[k1]:shuffled.offsets[k1 + 1]])


def test_empty_table(tmp_path: Path) -> None:
    with sqlite3.connect(_write(tmp_path, [])) as conn:
        m = stackoverflow_rowmap.build_row_map(conn)
    assert (m.rows, m.max_rowid, m.train_ids, len(m.starts), len(m.test_starts)) == (0, 0, (), 0, 0)
    assert m.offsets.tolist() == [0]


def test_map_is_reused_and_rebuilt_when_the_file_changes(tmp_path: Path, cache: Path, builds: list[int]) -> None:
    path = _write(tmp_path, _rows())
    first = _load(path)
    second = _load(path)
    assert len(builds) == 1  # the second load read the cached map: no second pass
    _same(first, second)
    assert len(list(cache.glob("stackoverflow/rowmap-*.pt"))) == 1
    with sqlite3.connect(path) as con:  # a changed file (size and mtime)
        con.execute("INSERT INTO examples SELECT 'train', 'u0new', serialized_example_proto FROM examples LIMIT 1")
    third = _load(path)
    assert len(builds) == 2 and "u0new" in third.users.client_ids
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same bytes, new mtime: mapped again
    _load(path)
    assert len(builds) == 3
    assert len(list(cache.glob("stackoverflow/rowmap-*.pt"))) == 1  # one entry per file, overwritten


def test_the_data_file_is_never_written(tmp_path: Path, cache: Path) -> None:
    path = _write(tmp_path / "data", _rows())
    before = (path.read_bytes(), os.stat(path).st_mtime_ns, sorted(p.name for p in path.parent.iterdir()))
    for _ in range(2):  # the pass, then the cached map
        data = _load(path)
        _ = [data.users[u] for u in range(len(data.users))]
        data.users._opened.close()
    assert (path.read_bytes(), os.stat(path).st_mtime_ns, sorted(p.name for p in path.parent.iterdir())) == before


@pytest.mark.parametrize("damage", ["garbage", "truncated", "bad_offsets", "unsorted_ids", "wrong_max_rowid",
                                    "overlapping_test_runs", "overlapping_train_runs"])
def test_a_corrupt_cache_entry_is_ignored_and_rebuilt(tmp_path: Path, cache: Path, builds: list[int],
                                                      damage: str) -> None:
    path = _write(tmp_path, _rows())
    expected = _load(path)
    [entry_path] = cache.glob("stackoverflow/rowmap-*.pt")
    stored = torch.load(entry_path, weights_only=True)
    if damage == "garbage":
        entry_path.write_bytes(b"not a torch file")
    elif damage == "truncated":
        entry_path.write_bytes(entry_path.read_bytes()[:100])
    else:
        if damage == "bad_offsets":
            stored["offsets"] = stored["offsets"].flip(0)
        elif damage == "unsorted_ids":
            stored["train_ids"] = stored["train_ids"][::-1]
        elif damage == "overlapping_test_runs":  # one run twice: its rows could be drawn twice
            for name in ("test_starts", "test_ends", "test_counts"):
                stored[name] = stored[name][[0, 0, *range(1, len(stored[name]))]]
        elif damage == "overlapping_train_runs":  # the first user's first run twice: its rows read twice
            for name in ("starts", "ends"):
                stored[name] = stored[name][[0, *range(len(stored[name]))]]
            stored["offsets"] = torch.cat([stored["offsets"][:1], stored["offsets"][1:] + 1])
        else:
            stored["max_rowid"] += 1
        save_entry(entry_path, stored.pop("key"), stored)
    again = _load(path)
    assert len(builds) == 2
    _same(expected, again)
    _load(path)  # the rebuilt entry replaced the damaged one
    assert len(builds) == 2


def test_an_unwritable_cache_still_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, builds: list[int]) -> None:
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache directory would be")
    monkeypatch.setenv("FEDPRIV_CACHE", str(blocker))
    path = _write(tmp_path / "data", _rows())
    indexed = _write(tmp_path / "indexed", _rows(), index=True)
    _same(_load(path), _load(indexed))
    assert len(builds) == 1


# --- a stale or poisoned entry (the right key, the wrong ranges) ---------------------------------


def _poison(entry_path: Path, **arrays) -> None:
    """Rewrite the cache entry's ``arrays`` under its own key: a stale or hostile entry that the key
    cannot tell from an honest one."""
    stored = torch.load(entry_path, weights_only=True)
    stored.update({name: torch.as_tensor(values, dtype=torch.int64) for name, values in arrays.items()})
    save_entry(entry_path, stored.pop("key"), stored)


def _train_run(path: Path, client: str) -> tuple[int, int, int]:
    """(first rowid, last rowid, rows present) of ``client``'s first train run in the file."""
    with closing(sqlite3.connect(path)) as conn:
        m = stackoverflow_rowmap.build_row_map(conn)
        k = m.train_ids.index(client)
        start, end = int(m.starts[m.offsets[k]]), int(m.ends[m.offsets[k]])
        rows = conn.execute("SELECT COUNT(*) FROM examples WHERE rowid BETWEEN ? AND ?", (start, end)).fetchone()[0]
    return start, end, rows


@pytest.mark.parametrize("layout", ["dense", "gaps"])
def test_a_poisoned_map_cannot_turn_a_users_train_rows_into_the_test_set(tmp_path: Path, cache: Path,
                                                                         builds: list[int], layout: str) -> None:
    plain, indexed = _write(tmp_path / "plain", _rows()), _write(tmp_path / "indexed", _rows(), index=True)
    if layout == "gaps":
        for path in (plain, indexed):
            with sqlite3.connect(path) as con:
                con.execute("DELETE FROM examples WHERE rowid % 5 = 0")
    start, end, rows = _train_run(plain, "u1")  # u1: 8 train rows, no test rows
    assert (rows < end - start + 1) == (layout == "gaps")  # the dense and the gap reading of a test run
    honest = _load(indexed)
    _load(plain)
    [entry_path] = cache.glob("stackoverflow/rowmap-*.pt")
    _poison(entry_path, test_starts=[start], test_ends=[end], test_counts=[rows])
    passes = len(builds)
    data = _load(plain)  # without the split filter: the "held-out" set would be u1's training sentences
    assert len(builds) == passes + 1  # the mismatch was seen and the map made again
    np.testing.assert_array_equal(data.test, honest.test)
    _load(plain)  # the rebuilt entry replaced the poisoned one
    assert len(builds) == passes + 1


def test_a_map_that_a_new_pass_cannot_fix_is_refused(tmp_path: Path, cache: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, _rows())
    with closing(sqlite3.connect(path)) as conn:
        honest = stackoverflow_rowmap.build_row_map(conn)
    start, end, rows = _train_run(path, "u1")
    wrong = dataclasses.replace(honest, test_starts=np.array([start]), test_ends=np.array([end]),
                                test_counts=np.array([rows]))
    monkeypatch.setattr(stackoverflow_rowmap, "build_row_map", lambda conn: wrong)  # as if the file kept changing
    with pytest.raises(ConfigError, match="test rows") as err:
        _load(path)
    assert "\n" not in str(err.value)


def test_a_poisoned_map_cannot_route_a_train_read_to_other_rows(tmp_path: Path, cache: Path) -> None:
    plain, indexed = _write(tmp_path / "plain", _rows()), _write(tmp_path / "indexed", _rows(), index=True)
    honest = _load(indexed)
    _load(plain)
    [entry_path] = cache.glob("stackoverflow/rowmap-*.pt")
    users = len(honest.users)
    top = len(_rows())  # every user's one run: the whole table (other users', test and heldout rows)
    _poison(entry_path, offsets=np.arange(users + 1), starts=[1] * users, ends=[top] * users)
    _same(_load(plain), honest)  # each read still returns only (train, that user)'s rows


def test_reads_through_the_map_are_rowid_seeks_whatever_other_index_the_file_has(tmp_path: Path) -> None:
    path = _write(tmp_path, _rows())
    with sqlite3.connect(path) as con:  # an index the planner would otherwise pick for split_name = ?
        con.execute("CREATE INDEX by_split ON examples (split_name)")
        con.execute("ANALYZE")
    queries = [(stackoverflow_rowmap._READ_RUN, (1, 9, "train", "u1", 5)),
               (stackoverflow_rowmap._TEST_RUN_ROWIDS, (1, 9)),
               (stackoverflow._test_read_query(3), (1, 2, 3, "test"))]
    with closing(sqlite3.connect(path)) as conn:
        for query, args in queries:
            plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", args)]
            assert plan and all("USING INTEGER PRIMARY KEY" in step for step in plan), (query, plan)


def test_the_cache_entry_is_owner_only(tmp_path: Path, cache: Path, builds: list[int]) -> None:
    path = _write(tmp_path, _rows())
    _load(path)
    [entry_path] = cache.glob("stackoverflow/rowmap-*.pt")
    assert stat.S_IMODE(entry_path.stat().st_mode) == 0o600  # it lists every train client and its rows
    _poison(entry_path, test_counts=[])  # an entry an older version left world-readable, and wrong
    entry_path.chmod(0o644)
    _load(path)
    assert len(builds) == 2 and stat.S_IMODE(entry_path.stat().st_mode) == 0o600  # replaced owner-only
    entry_path.chmod(0o644)  # a valid entry of an older version: tightened when read
    _load(path)
    assert len(builds) == 2 and stat.S_IMODE(entry_path.stat().st_mode) == 0o600
