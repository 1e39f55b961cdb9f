"""``python -m fedpriv.data.prepare_stackoverflow``: an indexed copy of TFF's sqlite file, made
atomically with Python's sqlite3 module; bad input is one ``error:`` line, exit 2, nothing written."""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fedpriv.data import prepare_stackoverflow
from fedpriv.data.stackoverflow import VOCAB_FILE_NAME, _has_client_index, load_stackoverflow
from fedpriv.data.stackoverflow_writer import write_examples
from tests.warm_launcher import run_module

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["how", "to", "sort", "a", "list", "in", "python", "i", "do", "it"]
ROWS = [(split, f"{split[0]}{u}", " ".join(WORDS[(u + k) % 10] for k in range(2 + u % 4)))
        for split, users in (("train", 7), ("heldout", 2), ("test", 3)) for u in range(users) for _ in range(3)]


def run_prepare(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return run_module("fedpriv.data.prepare_stackoverflow", *map(str, args), cwd=cwd, timeout=120,
                      env={**os.environ, "PYTHONPATH": str(ROOT)})


def one_error_line(res: subprocess.CompletedProcess) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rows(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT rowid, * FROM examples ORDER BY rowid").fetchall()


def indexes(path: Path) -> list[tuple[str, list[str]]]:
    with sqlite3.connect(path) as conn:
        return [(name, [c[2] for c in conn.execute("SELECT * FROM pragma_index_info(?)", (name,))])
                for _, name, *_ in conn.execute("PRAGMA index_list(examples)")]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """TFF's layout without an index, and the word counts beside it."""
    (tmp_path / VOCAB_FILE_NAME).write_text("".join(f"{w}\t{100 - i}\n" for i, w in enumerate(WORDS)))
    return write_examples(tmp_path / "stackoverflow.sqlite", ROWS, metadata=True)


def load(path: Path):
    return load_stackoverflow(path, vocab_size=8, seq_len=6, max_test_sentences=100)


def test_indexed_copy_beside_the_source(src: Path) -> None:
    before = digest(src)
    res = run_prepare(src)
    assert res.returncode == 0, res.stderr
    dst = src.with_name("stackoverflow.indexed.sqlite")
    assert indexes(dst) == [("examples_client", ["client_id", "split_name"])]
    with sqlite3.connect(dst) as conn:
        assert _has_client_index(conn)  # the loader's own test
    assert digest(src) == before and indexes(src) == []  # the source is only read
    assert rows(dst) == rows(src)
    assert sorted(p.name for p in src.parent.iterdir()) == sorted([VOCAB_FILE_NAME, dst.name, src.name])  # no temp
    assert f"wrote {dst}" in res.stdout
    assert res.stdout.splitlines()[-1].strip() == (
        f".venv/bin/python -m fedpriv.simulate +experiment=stackoverflow data.path={dst}")
    assert res.stderr == ""
    plain, indexed = load(src), load(dst)  # the copy loads, with the index, to the same data
    assert (plain.info["client_index"], indexed.info["client_index"]) == (False, True)
    assert len(indexed.users) == len(plain.users) == 7
    for u in range(len(plain.users)):
        np.testing.assert_array_equal(indexed.users[u], plain.users[u])
    np.testing.assert_array_equal(indexed.test, plain.test)


def test_named_destination_and_relative_paths(src: Path, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    res = run_prepare("stackoverflow.sqlite", "out/so.sqlite", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    dst = tmp_path / "out" / "so.sqlite"
    assert indexes(dst) == [("examples_client", ["client_id", "split_name"])] and rows(dst) == rows(src)
    assert f"data.path={dst}" in res.stdout  # absolute: the command works from any directory
    assert not src.with_name("stackoverflow.indexed.sqlite").exists()


def test_in_place(src: Path) -> None:
    expected = rows(src)
    res = run_prepare(src, "--in-place")
    assert res.returncode == 0, res.stderr
    assert indexes(src) == [("examples_client", ["client_id", "split_name"])] and rows(src) == expected
    assert sorted(p.name for p in src.parent.iterdir()) == sorted([VOCAB_FILE_NAME, src.name])
    assert res.stdout.splitlines()[-1].strip().endswith(f"data.path={src}")
    assert load(src).info["client_index"] is True


def test_an_indexed_source_is_left_as_it_is(tmp_path: Path) -> None:
    indexed = write_examples(tmp_path / "so.sqlite", ROWS, index=True)
    before = digest(indexed)
    res = run_prepare(indexed)
    assert res.returncode == 0, res.stderr
    assert "already has an index" in res.stdout and f"data.path={indexed}" in res.stdout
    assert digest(indexed) == before and [p.name for p in tmp_path.iterdir()] == ["so.sqlite"]


def _not_tff(path: Path) -> Path:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE other (x)")
    return path


def _no_tables(path: Path) -> Path:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 1")  # a valid, 4 KiB database file without a table
    return path


@pytest.mark.parametrize("make, needle", [
    (lambda p: p, "does not exist"),
    (lambda p: (p.mkdir(), p)[1], "not a file"),
    (lambda p: (p.write_bytes(b""), p)[1], "empty file"),
    (_no_tables, "empty sqlite database"),
    (lambda p: (p.write_bytes(b"not sqlite " * 400), p)[1], "cannot read"),
    (_not_tff, "no 'examples' table"),
])
def test_bad_source_is_one_error_line_and_writes_nothing(tmp_path: Path, make, needle: str) -> None:
    bad = make(tmp_path / "stackoverflow.sqlite")
    before = sorted(p.name for p in tmp_path.iterdir())
    for args in ((bad,), (bad, tmp_path / "dst.sqlite"), (bad, "--in-place")):
        res = run_prepare(*args)
        assert res.returncode == 2, res.stderr
        line = one_error_line(res)
        assert needle in line and str(bad) in line, line
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # no DST, no temporary file
        assert res.stdout == ""


def test_bad_destination_and_arguments(src: Path, tmp_path: Path) -> None:
    existing = tmp_path / "taken.sqlite"
    existing.write_bytes(b"keep")
    for args, needle in (((src, existing), "already exists"), ((src, src), "--in-place"),
                         ((src, tmp_path / "no" / "dir.sqlite"), "does not exist"),
                         ((src, tmp_path / "x.sqlite", "--in-place"), "pass no destination"),
                         ((), "src")):
        res = run_prepare(*args)
        assert res.returncode == 2, res.stderr
        assert needle in one_error_line(res)
    assert existing.read_bytes() == b"keep" and indexes(src) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([VOCAB_FILE_NAME, src.name, existing.name])


def test_a_failed_copy_leaves_nothing(src: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(prepare_stackoverflow, "INDEX_SQL", "CREATE INDEX broken ON examples (no_such_column)")
    with pytest.raises(SystemExit) as exit_:
        prepare_stackoverflow.main([str(src)])
    assert exit_.value.code == 1  # a failed write, not bad input
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write") and "nothing was written" in err and err.count("\n") == 1
    assert sorted(p.name for p in src.parent.iterdir()) == sorted([VOCAB_FILE_NAME, src.name])
    with pytest.raises(SystemExit):
        prepare_stackoverflow.main([str(src), "--in-place"])
    assert indexes(src) == []  # one transaction: unchanged


def test_a_destination_that_appears_meanwhile_is_never_replaced(src: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys) -> None:
    dst = src.with_name("late.sqlite")
    monkeypatch.setattr(prepare_stackoverflow, "_check_destination", lambda src, dst: dst.write_bytes(b"theirs"))
    with pytest.raises(SystemExit) as exit_:
        prepare_stackoverflow.main([str(src), str(dst)])
    assert exit_.value.code == 2 and "appeared while it was being written" in capsys.readouterr().err
    assert dst.read_bytes() == b"theirs"
    assert sorted(p.name for p in src.parent.iterdir()) == sorted([VOCAB_FILE_NAME, src.name, dst.name])


def test_the_loader_note_names_the_command(src: Path, caplog: pytest.LogCaptureFixture, capsys) -> None:
    with caplog.at_level(logging.INFO, logger="fedpriv"):
        load(src)
    warning = [r.getMessage() for r in caplog.records if "no index" in r.getMessage()]
    assert warning == [f"{src} has no index on examples(client_id): mapping its users to rowid ranges with one pass "
                       "over the table, once (the map is cached in $FEDPRIV_CACHE); an indexed copy needs no pass: "
                       f"python -m fedpriv.data.prepare_stackoverflow {src}"]
    assert "sqlite3 " not in warning[0] and capsys.readouterr().out == ""  # logged, never printed
