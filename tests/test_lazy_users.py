"""fedpriv.data.lazy_users.LazyUsers: the per-process handle (never pickled, reopened after a fork),
the lock and the bounded LRU that every lazily read federated text source shares (issue 53, step 1)."""

from __future__ import annotations

import json
import os
import pickle
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fedpriv.data import stackoverflow
from fedpriv.data.lazy_users import LazyUsers
from fedpriv.data.stackoverflow import SqliteUsers, load_stackoverflow


class _Handle:
    """A handle that cannot be pickled (it holds a lock), like a sqlite connection."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.guard = threading.Lock()


class _Users(LazyUsers):
    """``n`` users; user i is ``1 + i % 3`` rows of ``i``. Counts opens and reads (in this process)."""

    def __init__(self, n: int, cache_size: int = 64, delay: float = 0.0) -> None:
        self.n, self.delay = n, delay
        self.opens: list[int] = []
        self.reads: list[int] = []
        self.inside = self.most_inside = 0
        super().__init__(cache_size)

    def __len__(self) -> int:
        return self.n

    def _open(self) -> _Handle:
        self.opens.append(os.getpid())
        return _Handle()

    def _read(self, i: int) -> np.ndarray:
        assert self._handle().pid == os.getpid()  # never a handle of another process
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        time.sleep(self.delay)
        self.reads.append(i)
        self.inside -= 1
        return np.full((1 + i % 3, 4), i, dtype=np.int64)


def test_nothing_is_opened_before_a_read_and_one_handle_serves_every_read() -> None:
    users = _Users(5)
    assert users._opened is None and users.opens == []
    np.testing.assert_array_equal(users[4], np.full((2, 4), 4))
    np.testing.assert_array_equal(users[-1], users[4])
    np.testing.assert_array_equal(users[np.int64(2)], np.full((3, 4), 2))
    with pytest.raises(IndexError):
        users[5]
    assert users.opens == [os.getpid()] and users.reads == [4, 2]


def test_the_pickle_holds_no_handle_and_the_clone_opens_its_own() -> None:
    users = _Users(5)
    users[1]
    assert isinstance(users._opened, _Handle)
    with pytest.raises(TypeError):
        pickle.dumps(users._opened)  # the handle itself cannot travel
    state = users.__getstate__()
    assert not {"_pid", "_opened", "_lock", "_cache"} & set(state)
    clone = pickle.loads(pickle.dumps(users))
    assert clone._opened is None and len(clone._cache) == 0 and clone.opens == [os.getpid()]
    np.testing.assert_array_equal(clone[1], users[1])
    assert clone.opens == [os.getpid()] * 2 and clone._opened is not users._opened


def _in_child(users: LazyUsers, read: list[int], extra=dict) -> dict:
    """Read ``read`` in a forked child; returns what the child saw (its pid, rows, state, ``extra()``)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's cleanup
        code = 1
        try:
            rows = [users[i].tolist() for i in read]
            report = {"pid": os.getpid(), "rows": rows, "state_pid": users._pid,
                      "opens": getattr(users, "opens", None), "reads": getattr(users, "reads", None), **extra()}
            os.write(w, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return {**json.loads(out), "child": pid}


def test_a_forked_child_reopens_and_never_uses_the_parents_handle_or_cache() -> None:
    users = _Users(5)
    parent_rows = users[2].tolist()
    parent_handle = users._opened
    seen = _in_child(users, [2, 3])
    assert seen["pid"] == seen["child"] != os.getpid() and seen["state_pid"] == seen["child"]
    assert seen["opens"] == [os.getpid(), seen["child"]]  # a new handle, opened in the child
    assert seen["reads"] == [2, 2, 3]  # user 2 read again: the parent's cache was dropped
    assert seen["rows"][0] == parent_rows
    assert users._opened is parent_handle and users.opens == [os.getpid()]  # the parent's state is its own


def test_the_lru_is_bounded_and_callers_get_copies() -> None:
    users = _Users(100, cache_size=2)
    for i in (0, 1, 0, 2):
        users[i]
    assert users.reads == [0, 1, 2] and list(users._cache) == [0, 2]  # 1 was the least recently used
    users[1]
    assert users.reads == [0, 1, 2, 1] and list(users._cache) == [2, 1]
    for i in range(100):
        users[i]
        assert len(users._cache) <= 2
    rows = users[99]
    rows[:] = -1
    assert (users[99] == 99).all()  # the cached rows are unharmed
    uncached = _Users(3, cache_size=0)
    uncached[1], uncached[1]
    assert uncached.reads == [1, 1] and len(uncached._cache) == 0
    with pytest.raises(ValueError, match="cache_size"):
        _Users(3, cache_size=-1)


def test_threads_read_through_the_handle_one_at_a_time() -> None:
    users = _Users(16, cache_size=0, delay=0.002)
    threads = [threading.Thread(target=lambda k=k: [users[(k + j) % 16] for j in range(4)]) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(users.reads) == 24 and users.most_inside == 1 and len(users.opens) == 1


# --- the StackOverflow reader is one -----------------------------------------------------------


@pytest.fixture
def sqlite_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SqliteUsers:
    from tests.test_stackoverflow import WORD_COUNTS, make_db

    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cache"))
    (tmp_path / "stackoverflow.word_count").write_text(WORD_COUNTS)
    users = load_stackoverflow(make_db(tmp_path / "stackoverflow.sqlite"), vocab_size=5, seq_len=6).users
    assert isinstance(users, SqliteUsers) and isinstance(users, LazyUsers)
    return users


def test_sqlite_users_pickle_without_their_connection(sqlite_users: SqliteUsers) -> None:
    rows = [sqlite_users[i] for i in range(len(sqlite_users))]
    assert sqlite_users._opened is not None  # an open sqlite3.Connection, which cannot be pickled
    clone = pickle.loads(pickle.dumps(sqlite_users))
    assert clone._opened is None
    for i, expected in enumerate(rows):
        np.testing.assert_array_equal(clone[i], expected)


def test_sqlite_users_reconnect_in_a_forked_child(sqlite_users: SqliteUsers, monkeypatch) -> None:
    connects: list[int] = []
    real = stackoverflow._connect
    monkeypatch.setattr(stackoverflow, "_connect", lambda path: connects.append(os.getpid()) or real(path))
    expected = [sqlite_users[i].tolist() for i in range(len(sqlite_users))]
    assert connects == [os.getpid()]
    seen = _in_child(sqlite_users, list(range(len(sqlite_users))), extra=lambda: {"connects": connects})
    assert seen["rows"] == expected and seen["state_pid"] == seen["child"]
    assert seen["connects"] == [os.getpid(), seen["child"]]  # the child connected itself, once
    assert connects == [os.getpid()]  # and the parent's connection stays the parent's
    with pytest.raises(TypeError):
        pickle.dumps(sqlite_users._opened)
