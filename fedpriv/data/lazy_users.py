"""A federated dataset's users read on demand: the per-process state every lazy reader needs.

A source of millions of users (TFF's StackOverflow sqlite file; ``data=files``' Arrow tables) is not
read into memory: ``users[i]`` reads user ``i`` when a cohort samples it. The same object is used in
the process that loaded it, in forked workers and, pickled, in Flower's worker processes, so the
handle on the source (a sqlite connection, an open dataset) is per process: opened on the first
read in a process, dropped (never used) after a fork, never pickled. A pickle carries only what the
subclass keeps besides (the path, the user ids, the vocabulary): small, whatever was read before.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
import operator
import os
import threading
from typing import Any

import numpy as np

_PROCESS_STATE = ("_pid", "_opened", "_lock", "_cache")  # never pickled; reset in a new process


class LazyUsers(Sequence[np.ndarray], ABC):
    """``users[i]``: user ``i``'s rows (int64 ``[n_i, seq_len + 1]``), read on demand, a fresh copy each time.

    Subclasses give ``__len__``, :meth:`_open` (this process's handle on the source) and :meth:`_read`
    (user ``i``'s rows, through :meth:`_handle`). This class keeps the rest: the handle, opened on
    the first read in each process (after a fork or unpickling too: the process id is checked on
    every read); a lock, so that threads of one process read through one handle in turn; and an LRU
    cache of the last ``cache_size`` users read (0: none), bounded whatever is read.
    """

    def __init__(self, cache_size: int = 64) -> None:
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        self.cache_size = cache_size
        self._reset_process_state()

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def _open(self) -> Any:
        """A handle on the source for this process (e.g. a read-only connection)."""

    @abstractmethod
    def _read(self, i: int) -> np.ndarray:
        """User ``i``'s rows (``0 <= i < len(self)``), read through :meth:`_handle`; called under the lock."""

    def _handle(self) -> Any:
        """This process's handle, opened by :meth:`_open` on first use."""
        if self._opened is None:
            self._opened = self._open()
        return self._opened

    def _reset_process_state(self) -> None:
        """A new process's state: no handle (a parent's is not used, nor closed: it is the parent's), an empty cache."""
        self._pid = os.getpid()
        self._opened: Any = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for key in _PROCESS_STATE:
            del state[key]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset_process_state()

    def __getitem__(self, index: int) -> np.ndarray:  # type: ignore[override]
        i = operator.index(index)
        if not -len(self) <= i < len(self):
            raise IndexError(f"user index {i} out of range for {len(self)} users")
        i %= len(self)
        if self._pid != os.getpid():
            self._reset_process_state()
        with self._lock:
            rows = self._cache.get(i)
            if rows is None:
                rows = self._read(i)
                self._cache[i] = rows
                if len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(i)
        return rows.copy()
