"""Writing files in TFF's StackOverflow schema: ``tf.train.Example`` protos in a sqlite table
``examples(split_name, client_id, serialized_example_proto)`` — the inverse of the reader in
:mod:`fedpriv.data.stackoverflow`; both use the one Example codec, :mod:`fedpriv.data.tf_example`.
The tests' fixtures and ``scripts/bench_scale.py`` generate their files with it (nothing here
downloads data)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

from fedpriv.release.atomic import write_atomic
from fedpriv.data.tf_example import encode_example

VOCAB_FILE_NAME = "stackoverflow.word_count"  # TFF's vocabulary file, beside the sqlite file (the reader's too)


def write_examples(path: Path, rows: Iterable[tuple[str, str, str]], *, metadata: bool = False,
                   index: bool = False) -> Path:
    """A sqlite file with TFF's schema from ``(split, client_id, tokens)`` rows; each example carries
    TFF's other features too (fixed placeholder values). ``metadata``: also the
    ``client_metadata`` table; ``index``: an index on (client_id, split_name)."""
    con = sqlite3.connect(path)
    try:
        con.execute("CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL,"
                    " serialized_example_proto BLOB NOT NULL)")
        con.executemany("INSERT INTO examples VALUES (?, ?, ?)", (
            (split, client, encode_example({"creation_date": [b"2017-01-01 00:00:00+00:00"], "title": [b"how to sort"],
                                            "score": [n - 3], "tags": [b"python|list"], "tokens": [tokens.encode()],
                                            "type": [b"question"]}))
            for n, (split, client, tokens) in enumerate(rows)))
        if metadata:
            con.execute("CREATE TABLE client_metadata (client_id TEXT, split_name TEXT, num_examples INTEGER)")
            con.execute("INSERT INTO client_metadata SELECT client_id, split_name, COUNT(*) FROM examples"
                        " GROUP BY client_id, split_name")
        if index:
            con.execute("CREATE INDEX examples_client ON examples (client_id, split_name)")
        con.commit()
    finally:
        con.close()
    return path


def write_tiny_dataset(directory: Path) -> Path:
    """``stackoverflow.sqlite`` (indexed; 12 train and 6 test users of 3 sentences over 10 words)
    and its ``stackoverflow.word_count`` under ``directory``: a runnable instance for the contract
    tests (tests/test_plugins.py). Returns the sqlite file's path."""
    words = ["how", "to", "sort", "a", "list", "in", "python", "i", "do", "it"]
    rows = [(split, f"{split[0]}{u}", " ".join(words[(u + k) % 10] for k in range(3 + u % 4)))
            for split, users in (("train", 12), ("test", 6)) for u in range(users) for _ in range(3)]
    db = write_examples(Path(directory) / "stackoverflow.sqlite", rows, index=True)
    write_atomic(Path(directory) / VOCAB_FILE_NAME, "".join(f"{w}\t{100 - i}\n" for i, w in enumerate(words)).encode())
    return db
