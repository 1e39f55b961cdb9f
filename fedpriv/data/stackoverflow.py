"""TFF's StackOverflow (``stackoverflow.sqlite``) as a :class:`FederatedDataset`, without TensorFlow.

File layout (TFF): table ``examples(split_name TEXT, client_id TEXT, serialized_example_proto BLOB)``,
``split_name`` in {"train", "heldout", "test"}; each blob is a serialized ``tf.train.Example``
(decoded by :mod:`fedpriv.data.tf_example`) whose bytes feature ``tokens`` is one sentence of
space-separated lowercased words (also ``title``, ``tags``, ``type``, perhaps ``creation_date`` and
``score``, all ignored here). Files written by TFF's ``sql_client_data_utils`` also hold
``client_metadata(client_id, split_name, num_examples)``; when present it lists the clients, which
spares a scan of ``examples``.

Preprocessing is TFF's word-level StackOverflow task: the vocabulary is the first ``vocab_size`` (V)
words of ``stackoverflow.word_count``; ids are pad 0, words 1..V, OOV V+1, BOS V+2, EOS V+3. A
sentence becomes ``[BOS] + ids(words[:seq_len]) + [EOS]``, truncated to ``seq_len + 1`` and padded with
0 to ``seq_len + 1``; so a sentence of ``seq_len`` words or more loses its EOS (as in TFF, which only
appends EOS to shorter sentences). Words are split on whitespace: TFF splits on single spaces, which
is the same on this data (its extraneous whitespace was removed when the dataset was built).

Getting the file: download ``stackoverflow.sqlite.lzma`` (TFF_SQLITE_URL below), decompress it
(``unxz``/``lzma -d``) and put TFF's ``stackoverflow.word_count`` beside it. Optionally make an
indexed copy with ``python -m fedpriv.data.prepare_stackoverflow stackoverflow.sqlite``
(:mod:`fedpriv.data.prepare_stackoverflow`; Python's sqlite3 module only, no ``sqlite3`` CLI),
which saves the first load's pass over the table (below).

Scale: the real file has 342,477 train users and 135.8M sentences, so train users are read on demand
(:class:`SqliteUsers`). The file is opened read-only and nothing is ever written to it, so no index
is created. If ``examples`` has an index on ``client_id`` (:mod:`fedpriv.data.prepare_stackoverflow`
makes an indexed copy, index ``examples_client ON examples(client_id, split_name)``), a user read is
an index lookup. If it has none, the first load makes one streamed pass over the table in rowid
order and keeps a compact user -> rowid-range map beside the file's identity in ``$FEDPRIV_CACHE``
(:mod:`fedpriv.data.stackoverflow_rowmap`); a user read is then a few rowid seeks, and the train
client list and the test subset come from the map too, so no later load or read scans the table.
The load that makes the pass says so on stderr, naming the indexed copy (a load that finds the map
cached says nothing). Cost model and
measurements on generated files: docs/BENCHMARKS.md. None of this could be checked against the real
file here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
import logging
import os
from pathlib import Path
import sqlite3
from typing import Optional
import warnings

import numpy as np

import fedpriv.data.stackoverflow_rowmap as stackoverflow_rowmap

import fedpriv.data.word_rows as word_rows
from fedpriv.data.federated import FederatedDataset, Vocabulary
from fedpriv.data.lazy_users import LazyUsers
from fedpriv.data.stackoverflow_writer import VOCAB_FILE_NAME, write_tiny_dataset
from fedpriv.data.tf_example import decode_example
from fedpriv.errors import ConfigError
from fedpriv.schema import LOCATION, TextPipeline, register_option
from fedpriv.text.vocabulary import read_word_counts

logger = logging.getLogger(__name__)

TFF_SQLITE_URL = "https://storage.googleapis.com/tff-datasets-public/stackoverflow.sqlite.lzma"
_TRAIN, _TEST = "train", "test"
_TEST_FETCH_CHUNK = 500  # rowids per ``IN (...)`` query, below SQLite's bound-parameter limit

# ---------------------------------------------------------------------------------------------
# Vocabulary and sentence ids (the shared pieces: fedpriv.text.vocabulary, fedpriv.data.word_rows)
# ---------------------------------------------------------------------------------------------


_VOCAB_ORIGIN = (f"TFF's {VOCAB_FILE_NAME}, from the TensorFlow Federated datasets storage, "
                 "storage.googleapis.com/tff-datasets-public")


def load_word_counts(path: str | os.PathLike, size: int | None = None) -> list[str]:
    """The first ``size`` words (all for None) of TFF's ``stackoverflow.word_count`` at ``path``, the
    file ``data.vocab_path`` names (or the one beside the sqlite file): :func:`read_word_counts`, whose
    one-line refusals name ``data.vocab_path`` and TFF's file."""
    return read_word_counts(path, size, "data.vocab_path", origin=_VOCAB_ORIGIN)


class _BadExample(ConfigError):
    """An example that is not what TFF's file holds; :func:`_reading` names the file."""


def _sentence_words(blob: bytes) -> list[bytes]:
    """The words of one serialized example's ``tokens`` feature."""
    try:
        tokens = decode_example(blob).get("tokens")
    except ValueError as err:  # the codec's malformed protobuf
        raise _BadExample(f"an example is not a serialized tf.train.Example ({err}): the file is damaged, "
                          "or not TFF's stackoverflow.sqlite") from None
    if not tokens or not isinstance(tokens[0], bytes):
        raise _BadExample("an example has no 'tokens' bytes feature: not TFF's stackoverflow.sqlite")
    return tokens[0].split()


def _rows(blobs: Iterable[bytes], lookup: Mapping[bytes, int], vocab: Vocabulary, seq_len: int) -> np.ndarray:
    """One int64 row of ``seq_len + 1`` ids per serialized example (:func:`word_rows.sentence_rows`)."""
    return word_rows.sentence_rows((_sentence_words(b) for b in blobs), lookup, vocab, seq_len)


# ---------------------------------------------------------------------------------------------
# sqlite access (read-only)
# ---------------------------------------------------------------------------------------------


def _connect(path: Path) -> sqlite3.Connection:
    """Read-only connection (``mode=ro``): nothing, not even an index, is written to the file."""
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)


def _unreadable(path: Path, err: sqlite3.DatabaseError) -> ConfigError:
    return ConfigError(f"cannot read {path} ({err}): expected TFF's stackoverflow.sqlite, whole (an interrupted "
                       "download or decompression leaves a damaged file: redo it)")


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Reads of ``path`` inside: a damaged file (sqlite's "database disk image is malformed" on a
    page past the header, which only a read of that page finds; an example that does not decode) is
    one :class:`ConfigError` naming the file, never sqlite's or the codec's traceback."""
    try:
        yield
    except sqlite3.DatabaseError as err:
        raise _unreadable(path, err) from None
    except _BadExample as err:
        raise ConfigError(f"{path}: {err}") from None


def _check_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Raise a one-line :class:`ConfigError` unless ``path`` (open as ``conn``) has TFF's table
    ``examples(split_name, client_id, serialized_example_proto)``."""
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(examples)")}
        tables = [] if columns else [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    except sqlite3.DatabaseError as e:
        raise _unreadable(path, e) from None
    if not columns:
        redo = "; an interrupted download or decompression leaves such a file: redo it"
        what = (f"is an empty file (0 bytes){redo}" if path.stat().st_size == 0 else
                f"is an empty sqlite database (no tables){redo}" if not tables else
                f"holds other tables ({', '.join(tables[:5])}{', …' if len(tables) > 5 else ''})")
        raise ConfigError(f"{path} is not TFF's stackoverflow.sqlite (no 'examples' table): it {what}")
    missing = {"split_name", "client_id", "serialized_example_proto"} - columns
    if missing:
        raise ConfigError(f"{path} is not TFF's stackoverflow.sqlite: 'examples' lacks {sorted(missing)}")


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    return conn.execute(query, (name,)).fetchone() is not None


def _has_client_index(conn: sqlite3.Connection) -> bool:
    """True if an index on ``examples`` starts with client_id or with (split_name, client_id)."""
    for row in conn.execute("PRAGMA index_list(examples)").fetchall():
        columns = [info[2] for info in conn.execute("SELECT * FROM pragma_index_info(?)", (row[1],))]
        if columns[:1] == ["client_id"] or columns[:2] == ["split_name", "client_id"]:
            return True
    return False


def _train_client_ids(conn: sqlite3.Connection, max_users: int | None) -> list[str]:
    """The first ``max_users`` train client ids, sorted (SQLite's binary collation: code-point order)."""
    if _has_table(conn, "client_metadata"):
        query = (
            "SELECT DISTINCT client_id FROM client_metadata WHERE split_name = ? AND num_examples > 0"
            " ORDER BY client_id LIMIT ?"
        )
    else:
        query = "SELECT DISTINCT client_id FROM examples WHERE split_name = ? ORDER BY client_id LIMIT ?"
    limit = -1 if max_users is None else max_users
    return [row[0] for row in conn.execute(query, (_TRAIN, limit))]


def _client_blobs(conn: sqlite3.Connection, client_id: str, limit: int) -> list[bytes]:
    """A train client's first ``limit`` examples in file (rowid) order."""
    query = (
        "SELECT serialized_example_proto FROM examples WHERE split_name = ? AND client_id = ?"
        " ORDER BY rowid LIMIT ?"
    )
    return [row[0] for row in conn.execute(query, (_TRAIN, client_id, limit))]


class SqliteUsers(LazyUsers):
    """The train users of a StackOverflow sqlite file, each read and preprocessed on demand.

    ``users[i]`` is ``client_ids[i]``'s first ``max_sentences`` train sentences in file (rowid) order,
    as an int64 array ``[n, seq_len + 1]`` (a fresh copy each time). Each process opens its own
    read-only connection on first use (also after fork or unpickling); pickles carry only the path,
    the ids, the vocabulary and ``runs``. A small LRU cache keeps the last ``cache_size`` users
    (:class:`~fedpriv.data.lazy_users.LazyUsers`).

    ``runs``: ``(offsets, starts, ends)`` int64 arrays from a row map
    (:meth:`fedpriv.data.stackoverflow_rowmap.RowMap.user_runs`): user ``i``'s rows lie in the rowid
    ranges ``starts[offsets[i]:offsets[i + 1]]`` .. ``ends[...]`` (inclusive), read with rowid seeks;
    without it a user is read with ``WHERE client_id = ?`` (an index lookup, or a scan without one).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        client_ids: Sequence[str],
        vocab: Vocabulary,
        seq_len: int,
        max_sentences: int,
        cache_size: int = 64,
        runs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ) -> None:
        if runs is not None and len(runs[0]) != len(client_ids) + 1:
            raise ValueError(f"runs has offsets for {len(runs[0]) - 1} users, not {len(client_ids)}")
        self.path = Path(path)
        self.client_ids = tuple(client_ids)
        self.vocab = vocab
        self.seq_len = seq_len
        self.max_sentences = max_sentences
        self.runs = runs
        self._lookup = word_rows.word_lookup(vocab, bytes)
        super().__init__(cache_size)

    def __len__(self) -> int:
        return len(self.client_ids)

    def _open(self) -> sqlite3.Connection:
        return _connect(self.path)

    def _read(self, i: int) -> np.ndarray:
        with _reading(self.path):  # a damaged page of this user's rows: one line, mid-run too
            conn = self._handle()
            if self.runs is None:
                blobs = _client_blobs(conn, self.client_ids[i], self.max_sentences)
            else:
                offsets, starts, ends = self.runs
                lo, hi = int(offsets[i]), int(offsets[i + 1])
                blobs = stackoverflow_rowmap.read_user(
                    conn, self.client_ids[i], starts[lo:hi], ends[lo:hi], self.max_sentences)
            return _rows(blobs, self._lookup, self.vocab, self.seq_len)

    def __repr__(self) -> str:
        return f"SqliteUsers({str(self.path)!r}, {len(self)} users)"


# ---------------------------------------------------------------------------------------------
# Loader
# ---------------------------------------------------------------------------------------------


def _missing_data_message(path: Path) -> str:
    """Why ``path`` cannot be read as the sqlite file (missing, or a directory), and what to do."""
    if path.is_dir():
        inside = path / "stackoverflow.sqlite"
        hint = f" (this one holds it: data.path={inside})" if inside.is_file() else ""
        return (
            f"data.path={path} is a directory: data.path must be the sqlite file itself, TFF's "
            f"stackoverflow.sqlite (decompressed from stackoverflow.sqlite.lzma){hint}"
        )
    return (
        f"StackOverflow data not found at {path}: download TFF's stackoverflow.sqlite "
        f"({TFF_SQLITE_URL}, decompress it) "
        "and set data.path=/path/to/stackoverflow.sqlite"
    )


def _missing_vocab_message(path: Path) -> str:
    return (
        f"StackOverflow vocabulary not found at {path}: download {_VOCAB_ORIGIN}, and put it beside "
        f"stackoverflow.sqlite or set data.vocab_path=/path/to/{VOCAB_FILE_NAME}"
    )


def _check_args(**values: int | None) -> None:
    """The one check of the loader's sizes (the ``data=stackoverflow`` option's too): each >= 1."""
    for name, value in values.items():
        if value is not None and value < 1:
            raise ConfigError(f"data.{name} must be >= 1, got {value}")


def _private_vocab_words(
    conn: sqlite3.Connection, client_ids: Sequence[str], max_sentences: int, vocab_size: int
) -> list[str]:
    """Top words by occurrence over the sentences the users list yields (ties: word order).

    One pass over the train split in file order, applying the same per-user cap; TFF's own file
    counts users per word instead. Slow (pure-Python decoding) on the full file.
    """
    selected = set(client_ids)
    taken: Counter[str] = Counter()
    counts: Counter[bytes] = Counter()
    query = (
        "SELECT client_id, serialized_example_proto FROM examples WHERE split_name = ?"
        " ORDER BY rowid"
    )
    for client_id, blob in conn.execute(query, (_TRAIN,)):
        if client_id in selected and taken[client_id] < max_sentences:
            taken[client_id] += 1
            counts.update(_sentence_words(blob))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [word.decode("utf-8", "surrogateescape") for word, _ in ranked[:vocab_size]]


def _warn_private_vocab() -> None:
    message = (
        "StackOverflow vocabulary built from the private training data: it leaks information about "
        "users and is outside the differential-privacy guarantee"
    )
    warnings.warn(message, UserWarning, stacklevel=3)
    logger.warning(message)


def _vocabulary_words(
    conn: sqlite3.Connection,
    db: Path,
    vocab_path: str | os.PathLike | None,
    vocab_size: int,
    client_ids: Sequence[str],
    max_sentences: int,
    allow_private_vocab: bool,
) -> tuple[list[str], str]:
    """(top words, where they came from): ``vocab_path``, else the word-count file beside ``db``,
    else (only with ``allow_private_vocab``) counts over the private train split."""
    if vocab_path is not None:
        return load_word_counts(vocab_path, vocab_size), str(vocab_path)
    beside = db.with_name(VOCAB_FILE_NAME)
    if beside.is_file():
        return load_word_counts(beside, vocab_size), str(beside)
    if not allow_private_vocab:
        raise ConfigError(_missing_vocab_message(beside))
    _warn_private_vocab()
    return _private_vocab_words(conn, client_ids, max_sentences, vocab_size), "private train split"


def _test_read_query(n: int) -> str:
    """The examples of ``n`` rowids, only those of the test split (``+``: by rowid, no other index)."""
    return (f"SELECT serialized_example_proto FROM examples WHERE rowid IN ({','.join('?' * n)})"
            " AND +split_name = ? ORDER BY rowid")


def _test_blobs(
    conn: sqlite3.Connection, limit: int, seed: int, rowmap: stackoverflow_rowmap.RowMap | None = None
) -> list[bytes]:
    """Up to ``limit`` test examples: a seeded uniform subset of the test rowids, in rowid order
    (listed by a scan of the table, or, the same draw, from ``rowmap``'s test runs). Only rows of
    the test split are read, and all the drawn rowids must be such rows: else
    :class:`~fedpriv.data.stackoverflow_rowmap.RowMapMismatch` (a stale or poisoned map, or a file
    written to during the load), never train rows in the held-out set."""
    if rowmap is not None:
        rowids = rowmap.test_rowids(conn, limit, seed)
    else:
        query = "SELECT rowid FROM examples WHERE split_name = ? ORDER BY rowid"
        rowids = np.fromiter((row[0] for row in conn.execute(query, (_TEST,))), dtype=np.int64)
        rowids = rowids[word_rows.test_subset(len(rowids), limit, seed)]  # rowid order: a sorted subset
    blobs: list[bytes] = []
    for start in range(0, len(rowids), _TEST_FETCH_CHUNK):
        chunk = rowids[start : start + _TEST_FETCH_CHUNK].tolist()
        blobs.extend(row[0] for row in conn.execute(_test_read_query(len(chunk)), [*chunk, _TEST]))
    if len(blobs) != len(rowids):
        raise stackoverflow_rowmap.RowMapMismatch(f"{len(rowids) - len(blobs)} of the {len(rowids)} drawn "
                                                  "test rowids are not rows of the test split")
    return blobs


def _checked_test_blobs(
    conn: sqlite3.Connection, db: Path, limit: int, seed: int, rowmap: stackoverflow_rowmap.RowMap | None
) -> tuple[list[bytes], stackoverflow_rowmap.RowMap | None]:
    """(the test examples, the row map they were drawn with): a map that does not match the file is
    made again with a new pass; a mismatch after that is a one-line :class:`ConfigError`."""
    try:
        return _test_blobs(conn, limit, seed, rowmap), rowmap
    except stackoverflow_rowmap.RowMapMismatch as err:
        if rowmap is None:
            raise ConfigError(f"the test rows of {db} changed while they were read ({err}): is something "
                              "writing to the file? Load it again when nothing is") from None
        logger.warning("the cached row map of %s does not match the file (%s): mapping it again", db, err)
    rowmap = stackoverflow_rowmap.row_map(db, conn, fresh=True)
    try:
        return _test_blobs(conn, limit, seed, rowmap), rowmap
    except stackoverflow_rowmap.RowMapMismatch as err:
        raise ConfigError(f"the test rows of {db} do not match a new map of the file either ({err}): is "
                          "something writing to the file? Load it again when nothing is") from None


def load_stackoverflow(
    path: str | os.PathLike,
    *,
    vocab_path: str | os.PathLike | None = None,
    vocab_size: int = 10000,
    seq_len: int = 20,
    max_sentences_per_user: int = 256,
    max_users: int | None = None,
    max_test_sentences: int = 10000,
    seed: int = 0,
    allow_private_vocab: bool = False,
) -> FederatedDataset:
    """Loads TFF's StackOverflow word-level task (see the module docstring for the preprocessing).

    - Users: the train split's clients in sorted client_id order (the first ``max_users``), each
      with its first ``max_sentences_per_user`` sentences in file order, read lazily
      (:class:`SqliteUsers`). The heldout split is not used. A file without a client index is mapped
      once (:mod:`fedpriv.data.stackoverflow_rowmap`, cached in ``$FEDPRIV_CACHE``) so that no read
      scans the table; ``info["row_map"]`` says whether the map is used.
    - Vocabulary: the first ``vocab_size`` words of ``vocab_path``, or of ``stackoverflow.word_count``
      beside the sqlite file. Without either, ``allow_private_vocab=True`` counts words over the
      private train data (with a warning: outside the DP guarantee); otherwise ``ConfigError``.
    - Test: up to ``max_test_sentences`` sentences of the test split, a uniform subset chosen with
      ``seed``, in file order.

    ``info["vocab_size"]`` is V, the number of words (``vocab.size`` is V + 4). Raises ``ConfigError``
    (one line) for a missing or malformed file or an out-of-range argument.
    """
    _check_args(
        vocab_size=vocab_size,
        seq_len=seq_len,
        max_sentences_per_user=max_sentences_per_user,
        max_users=max_users,
        max_test_sentences=max_test_sentences,
    )
    db = Path(path)
    if not db.is_file():
        raise ConfigError(_missing_data_message(db))
    with closing(_connect(db)) as conn, _reading(db):
        _check_schema(conn, db)
        indexed = _has_client_index(conn)
        rowmap = None if indexed else stackoverflow_rowmap.row_map(db, conn)
        # The test rows first: they check the map (and a map found stale is made again).
        test_blobs, rowmap = _checked_test_blobs(conn, db, max_test_sentences, seed, rowmap)
        if rowmap is None or _has_table(conn, "client_metadata"):
            client_ids = _train_client_ids(conn, max_users)
        else:  # the same list (sorted, non-empty train clients), without a scan
            client_ids = list(rowmap.train_ids[:max_users])
        if not client_ids:
            raise ConfigError(f"{db} has no clients in its 'train' split")
        words, vocab_source = _vocabulary_words(
            conn, db, vocab_path, vocab_size, client_ids, max_sentences_per_user, allow_private_vocab
        )
        vocab = Vocabulary.of_words(words)
        test = _rows(test_blobs, word_rows.word_lookup(vocab, bytes), vocab, seq_len)
    runs = None if rowmap is None else rowmap.user_runs(client_ids)
    users = SqliteUsers(db, client_ids, vocab, seq_len, max_sentences_per_user, runs=runs)
    return FederatedDataset(
        name="stackoverflow",
        vocab=vocab,
        seq_len=seq_len,
        users=users,  # a lazy Sequence[np.ndarray]
        test=test,
        info={
            "path": str(db),
            "num_users": len(users),
            "num_test": len(test),
            "vocab_size": len(words),
            "vocab_source": vocab_source,
            **({"non_private_reason": "the word vocabulary was counted on the private train split "
                                      "(data.allow_private_vocab=true): which words it holds is not accounted"}
               if vocab_source == "private train split" else {}),
            "max_sentences_per_user": max_sentences_per_user,
            "client_index": indexed,
            "row_map": rowmap is not None,
        },
    )


# --- config options (fedpriv/schema/parser.py registers them with Hydra) -------------------------


@dataclass
class StackOverflowData(TextPipeline):
    """TFF's StackOverflow (a local sqlite file; never downloaded)."""

    name: str = "stackoverflow"
    # TFF's stackoverflow.sqlite, with stackoverflow.word_count beside it
    path: Optional[str] = field(default="data/stackoverflow.sqlite", metadata=LOCATION)
    # the word-count file of the vocabulary (null: stackoverflow.word_count beside path)
    vocab_path: Optional[str] = field(default=None, metadata=LOCATION)
    vocab_size: int = 10000  # most frequent words kept (the rest map to one unknown token)
    max_sentences_per_user: int = 256  # cap on each user's training sentences
    max_users: Optional[int] = None  # the first N train users in client_id order (null: all)
    max_test_sentences: int = 10000  # size of the uniform test subset
    # true: without a word-count file, count words over the private train split (warned: not private)
    allow_private_vocab: bool = False

    def check(self, path: str) -> None:
        super().check(path)
        _check_args(vocab_size=self.vocab_size, max_sentences_per_user=self.max_sentences_per_user,
                    max_users=self.max_users, max_test_sentences=self.max_test_sentences)

    def example_overrides(self, directory) -> list[str]:
        """A generated TFF-schema file of 12 users, and its word counts, under ``directory``."""
        return [f"data.path={write_tiny_dataset(Path(directory))}", "data.vocab_size=8", "data.seq_len=6"]

    def implied_locations(self) -> dict[str, str]:
        if self.vocab_path is None and self.path and (beside := Path(self.path).with_name(VOCAB_FILE_NAME)).is_file():
            return {"vocab_path": str(beside)}  # the vocabulary the loader reads
        return {}

    def load_words(self) -> FederatedDataset:
        """The users' sentences from TFF's sqlite file (never downloaded)."""
        if not self.path:
            raise ConfigError("data.path is not set: point it at TFF's stackoverflow.sqlite")
        return load_stackoverflow(self.path, vocab_path=self.vocab_path, vocab_size=self.vocab_size,
                                  seq_len=self.seq_len, max_sentences_per_user=self.max_sentences_per_user,
                                  max_users=self.max_users, max_test_sentences=self.max_test_sentences,
                                  seed=self.seed, allow_private_vocab=self.allow_private_vocab)


register_option("data", "stackoverflow", StackOverflowData())

