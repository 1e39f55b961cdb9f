"""Reading ``data.path`` for ``data=files`` (fedpriv/data/files_source.py): every form gives the same
rows; every bad input is one ConfigError line; the user's directory, their home and the network
are never touched."""

from __future__ import annotations

import csv
import gzip
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedpriv.data import files_source as fs
from fedpriv.errors import ConfigError
from fedpriv.text.corpora import datasets_module

ROOT = Path(__file__).resolve().parent.parent
# ids that pandas' CSV defaults would mangle (007 -> 7.0, NA -> missing, 1e5 -> 100000.0), a non-ASCII one
ROWS = [
    ("007", "hello, world", "train"),
    ("NA", "a text by \"NA\"", "test"),
    ("1e5", "one e five", "train"),
    ("alice", "good morning", "train"),
    ("007", "second from 007", "train"),
    ("Émile", "bonjour", "validation"),
    ("bob", "hi", "test"),
    ("NA", "again", "train"),
]
COLUMNS = ("user", "text", "split")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A fresh cache and home; no network: every connection attempt is recorded and refused."""
    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    for var in ("HF_HOME", "HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):  # unset here, restored after the test
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    attempts = []

    def refuse(self, address, *args):
        attempts.append(address)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    yield
    assert attempts == []
    assert not any((tmp_path / "home").iterdir())


def _records(rows=ROWS):
    return [dict(zip(COLUMNS, r)) for r in rows]


def write(path: Path, rows=ROWS) -> Path:
    """``rows`` in the format of ``path``'s suffix (``.jsonl``, ``.json``, ``.csv``, ``.parquet``, + ``.gz``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    if name.endswith(".parquet"):
        pq.write_table(pa.table({c: [r[i] for r in rows] for i, c in enumerate(COLUMNS)}), path)
        return path
    if name.endswith(".csv"):
        import io

        buffer = io.StringIO()
        w = csv.writer(buffer)
        w.writerow(COLUMNS)
        w.writerows(rows)
        text = buffer.getvalue()
    elif name.endswith(".jsonl"):
        text = "".join(json.dumps(r) + "\n" for r in _records(rows))
    else:
        text = json.dumps(_records(rows))
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def save_to_disk(path: Path, rows=ROWS, as_dict: bool = False) -> Path:
    datasets = datasets_module()
    table = {c: [r[i] for r in rows] for i, c in enumerate(COLUMNS)}
    if as_dict:
        parts = {name: datasets.Dataset.from_dict({c: [r[i] for r in rows if r[2] == name] for i, c in
                                                   enumerate(COLUMNS)})
                 for name in ("train", "test", "validation") if any(r[2] == name for r in rows)}
        datasets.DatasetDict(parts).save_to_disk(str(path))
    else:
        datasets.Dataset.from_dict(table).save_to_disk(str(path))
    return path


def rows_of(ds) -> list[tuple]:
    return list(zip(*(ds.data.table.column(c).to_pylist() for c in COLUMNS)))


def make(form: str, tmp_path: Path) -> str:
    """``data.path`` of ``ROWS`` written in ``form``."""
    data = tmp_path / "data"
    if form == "glob":  # two files, matched in sorted order
        write(data / "part-1.jsonl", ROWS[:3])
        write(data / "part-2.jsonl", ROWS[3:])
        return str(data / "part-*.jsonl")
    if form == "directory":  # nested files, sorted by relative name; other files are not read
        write(data / "a" / "1.parquet", ROWS[:5])
        write(data / "b.parquet", ROWS[5:])
        (data / "README.md").write_text("not data")
        (data / ".hidden.parquet").write_bytes(b"not read")
        return str(data)
    if form == "save_to_disk":
        return str(save_to_disk(data / "saved"))
    return str(write(data / f"rows.{form}"))


FORMS = ["jsonl", "json", "csv", "parquet", "jsonl.gz", "csv.gz", "glob", "directory", "save_to_disk"]


@pytest.mark.parametrize("form", FORMS)
def test_every_form_reads_the_same_rows_as_text(form, tmp_path, capfd):
    path = make(form, tmp_path)
    capfd.readouterr()
    source = fs.open_source(path, "user", "text", "split")
    assert rows_of(source.train) == ROWS  # 007, NA and 1e5 stay strings; file order kept
    assert source.split == "column" and source.test is None
    assert dict(source.columns)["user"] in ("string", "large_string")
    assert capfd.readouterr().err == ""  # no progress bar, no log line of datasets'
    again = fs.open_source(path, "user", "text", "split")  # the second load: from the cache
    assert rows_of(again.train) == ROWS and again.key == source.key
    assert again.converted is False
    assert source.converted is (form != "save_to_disk")
    assert fs.open_source(path, "user", "text").split == "users"


def test_names_with_glob_characters_are_read_literally(tmp_path):
    odd = write(tmp_path / "data" / "rows[1].jsonl")
    write(tmp_path / "data" / "rows1.jsonl", ROWS[:2])  # what the name would match as a pattern
    assert rows_of(fs.open_source(str(odd), "user", "text").train) == ROWS


def test_a_datasetdict_directory_splits_by_its_split_names(tmp_path):
    path = save_to_disk(tmp_path / "saved", as_dict=True)
    source = fs.open_source(str(path), "user", "text")
    assert source.split == "dict" and source.kind == fs.SAVE_TO_DISK
    assert rows_of(source.train) == [r for r in ROWS if r[2] == "train"]
    assert rows_of(source.test) == [r for r in ROWS if r[2] == "test"]


def test_a_copy_elsewhere_opens_the_same_converted_table(tmp_path, monkeypatch):
    first = write(tmp_path / "a" / "rows.jsonl")
    source = fs.open_source(str(first), "user", "text")
    copy = tmp_path / "b" / "copy.jsonl"
    copy.parent.mkdir()
    copy.write_bytes(first.read_bytes())
    monkeypatch.setattr(fs, "_convert_into", lambda *a, **k: pytest.fail("converted again"))
    again = fs.open_source(str(copy), "user", "text")
    assert again.entry == source.entry and rows_of(again.train) == ROWS


def _snapshot(root: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*"))


@pytest.mark.parametrize("form", ["jsonl", "directory", "save_to_disk"])
def test_a_load_writes_nothing_into_the_data_directory(form, tmp_path):
    from fedpriv.data.files_index import user_index

    path = make(form, tmp_path)
    before = _snapshot(tmp_path / "data")
    for _ in range(2):  # a conversion (or an open in place), then a cached load
        source = fs.open_source(path, "user", "text", "split")
        index = user_index(source)
        assert source.train[index.rows_of(0).tolist()]["user"]  # a read through the index
    assert _snapshot(tmp_path / "data") == before


def test_the_cache_entry_is_owner_only(tmp_path):
    source = fs.open_source(str(write(tmp_path / "rows.jsonl")), "user", "text")
    assert source.entry.is_relative_to(tmp_path / "cache")
    for p in [source.entry, *source.entry.rglob("*")]:
        assert p.stat().st_mode & 0o777 == (0o700 if p.is_dir() else 0o600), p


def put(path: Path, content: str | bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def parquet(path: Path, columns: dict) -> str:
    pq.write_table(pa.table(columns), path)
    return str(path)


def _corrupt_second_file(tmp_path: Path) -> str:
    write(tmp_path / "d" / "1.jsonl")
    (tmp_path / "d" / "2.jsonl").write_text('{"user": "x", "text": "fine"}\n{"user": "y", "text"\n')
    return str(tmp_path / "d")


# (what to write, columns, words the one line must hold)
BAD = {
    "missing path": (lambda t: str(t / "absent.jsonl"), ("user", "text"), ["no such file"]),
    "corrupt JSON": (lambda t: put(t / "bad.jsonl", '{"user": "a", "text"\n'),
                     ("user", "text"), ["cannot read", "bad.jsonl", "JSON Lines"]),
    "corrupt parquet": (lambda t: put(t / "bad.parquet", b"PAR1 not parquet"),
                        ("user", "text"), ["cannot read", "bad.parquet", "Parquet"]),
    "corrupt one of several": (_corrupt_second_file, ("user", "text"), ["cannot read", "2.jsonl"]),
    "missing column": (lambda t: str(write(t / "r.jsonl")), ("author", "text"),
                       ["data.user_column='author'", "its columns: user, text, split"]),
    "missing split column": (lambda t: str(write(t / "r.csv")), ("user", "text", "part"),
                             ["data.split_column='part'", "its columns: user, text, split"]),
    "empty text": (lambda t: str(write(t / "r.jsonl", ROWS[:3] + [("bob", "  \t", "train")])), ("user", "text"),
                   ["row 4", "empty text"]),
    "null text": (lambda t: str(write(t / "r.parquet", ROWS[:2] + [("bob", None, "train")])), ("user", "text"),
                  ["row 3", "empty text"]),
    "no user id": (lambda t: str(write(t / "r.csv", ROWS[:5] + [("", "no id", "train")])), ("user", "text"),
                   ["row 6", "no user id"]),
    "mixed user types": (lambda t: put(t / "m.jsonl", '{"user": 1, "text": "a"}\n{"user": "x", "text": "b"}\n'),
                         ("user", "text"), ["mixes value types"]),
    "float user ids": (lambda t: parquet(t / "f.parquet", {"user": [1.0, 2.5], "text": ["a", "b"]}),
                       ("user", "text"), ["holds double values", "strings or integers"]),
    "numbers as text": (lambda t: parquet(t / "n.parquet", {"user": ["a"], "text": [3]}), ("user", "text"),
                        ["holds int64 values, not text"]),
    "no train rows": (lambda t: str(write(t / "r.jsonl", [r for r in ROWS if r[2] != "train"])),
                      ("user", "text", "split"), ["'train'", "'test'", "'validation'"]),
    "DatasetDict without train": (lambda t: str(save_to_disk(t / "s", [r for r in ROWS if r[2] != "train"],
                                                             as_dict=True)), ("user", "text"),
                                  ["without a 'train' split"]),
    "split column on a DatasetDict": (lambda t: str(save_to_disk(t / "s", as_dict=True)), ("user", "text", "split"),
                                      ["data.split_column cannot be used", "DatasetDict"]),
    "txt not UTF-8": (lambda t: put(t / "d" / "a.txt", "fine\n") and put(t / "d" / "b.txt", b"caf\xe9\n")
                      and str(t / "d"), ("file", "text"), ["cannot read", "b.txt", "not UTF-8"]),
    "txt without a line": (lambda t: put(t / "d" / "a.txt", "fine\n") and put(t / "d" / "b.txt", " \n\n")
                           and str(t / "d"), ("file", "text"), ["cannot read", "b.txt", "no non-empty line"]),
    "txt columns": (lambda t: put(t / "u1.txt", "hi\n"), ("user", "text"),
                    ["data.user_column='user'", "its columns: file, text"]),
    "txt beside other formats": (lambda t: str(write(t / "d" / "a.jsonl") and put(t / "d" / "b.txt", "x\n")
                                               and t / "d"), ("file", "text"), ["mixes file formats", "text"]),
    "mixed formats": (lambda t: str(write(t / "d" / "a.csv") and write(t / "d" / "b.jsonl") and t / "d"),
                      ("user", "text"), ["mixes file formats", "CSV", "JSON Lines"]),
    "no data in a directory": (lambda t: put(t / "d" / "notes.md", "x") and str(t / "d"),
                               ("user", "text"), ["no .jsonl", ".md"]),
    "empty file": (lambda t: put(t / "e.jsonl", ""), ("user", "text"), ["e.jsonl", "is empty"]),
    "same column twice": (lambda t: str(write(t / "r.jsonl")), ("user", "user"), ["different columns"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_config_error_line(case, tmp_path, capfd):
    make_path, columns, words = BAD[case]
    path = make_path(tmp_path)
    capfd.readouterr()
    with pytest.raises(ConfigError) as err:
        fs.open_source(path, *columns)
    message = str(err.value)
    assert "\n" not in message and len(message) < 400, message
    for word in words:
        assert word in message, message
    assert capfd.readouterr().err == ""  # datasets' own "Failed to read ..." line is silenced
    kept = list((tmp_path / "cache").rglob("*"))
    assert not [p for p in kept if p.name.endswith((".tmp", ".old"))]  # nothing half-written
    if "cannot read" in message:  # no entry for files that do not read
        assert not [p for p in kept if p.parent.name == "files"]


def test_a_fresh_process_writes_nothing_under_home_and_opens_no_socket(tmp_path):
    """In a new interpreter (where ``datasets`` is first imported by fedpriv) with no HF_* setting:
    the load converts, indexes, and leaves $HOME empty, without a connection attempt."""
    path = write(tmp_path / "data" / "rows.jsonl")
    saved = save_to_disk(tmp_path / "data" / "saved")
    script = textwrap.dedent(f"""
        import socket
        attempts = []
        def refuse(self, address, *args):
            attempts.append(address)
            raise OSError("no network")
        socket.socket.connect = socket.socket.connect_ex = refuse
        from fedpriv.data.files_source import open_source
        from fedpriv.data.files_index import user_index
        for path in ({str(path)!r}, {str(saved)!r}):
            source = open_source(path, "user", "text", "split")
            assert len(user_index(source)) == 4
        assert attempts == [], attempts
    """)
    home = tmp_path / "fresh-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "XDG_"))}
    env.update(HOME=str(home), FEDPRIV_CACHE=str(tmp_path / "fresh-cache"), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == ""
    assert list(home.rglob("*")) == []


# --- .txt files: one user per file ------------------------------------------------------------------

def test_txt_files_are_one_user_each_named_by_their_path_under_data_path(tmp_path):
    data = tmp_path / "data"
    put(data / "b.txt", "Hello there.\n\n  \r\nsecond line\r\n")  # blank lines are no rows; CRLF dropped
    put(data / "a" / "c.txt", "nested user\n")
    (data / "z.txt.gz").write_bytes(gzip.compress("gzipped\n".encode()))
    (data / ".hidden.txt").write_text("not read\n")
    before = _snapshot(data)
    source = fs.open_source(str(data), "file", "text")
    got = list(zip(*(source.train.data.table.column(c).to_pylist() for c in ("file", "text"))))
    assert got == [("a/c.txt", "nested user"), ("b.txt", "Hello there."), ("b.txt", "second line"),
                   ("z.txt.gz", "gzipped")]
    assert source.kind == "txt" and source.converted and source.split == "users"
    assert fs.open_source(str(data), "file", "text").converted is False  # cached by content
    assert _snapshot(data) == before  # written into the cache, never next to the data
    one = fs.open_source(str(data / "b.txt"), "file", "text")  # a single file: its own name
    assert one.train.data.table.column("file").to_pylist() == ["b.txt", "b.txt"]


def test_a_renamed_txt_file_is_another_user(tmp_path):
    """The names are the user ids, so they are part of the cache key (the content alone is not)."""
    first = put(tmp_path / "one" / "alice.txt", "same text\n")
    second = put(tmp_path / "two" / "bob.txt", "same text\n")
    a, b = fs.open_source(first, "file", "text"), fs.open_source(second, "file", "text")
    assert a.entry != b.entry
    assert b.train.data.table.column("file").to_pylist() == ["bob.txt"]


def test_the_converted_table_is_rewritten_in_large_record_batches(tmp_path, monkeypatch):
    """datasets writes batches of ~1,000 rows, each with its own metadata: opening such a mapped
    stream read every batch's metadata and the kernel mapped the pages around each read, so a 5M-row
    table was resident whole before a user was read (1.2 GB; docs/BENCHMARKS.md). The cached table is
    rewritten in batches of BATCH_ROWS rows, the rows unchanged."""
    monkeypatch.setattr(fs, "BATCH_ROWS", 700)
    rows = [(f"u{i % 97:03d}", f"sentence number {i}", "train") for i in range(2500)]
    src = fs.open_source(write(tmp_path / "data" / "rows.jsonl", rows), "user", "text", "split")
    assert [r["text"] for r in src.train] == [r[1] for r in rows]
    parts = sorted((src.entry / "table").glob("part-*.arrow"))
    sizes = [b.num_rows for p in parts for b in pa.ipc.open_stream(pa.memory_map(str(p)))]
    assert sum(sizes) == 2500 and all(s == 700 for s in sizes[:-1]) and sizes[-1] <= 700, sizes

    small = tmp_path / "small.arrow"
    with pa.OSFile(str(small), "wb") as sink, pa.ipc.new_stream(sink, pa.schema([("x", pa.int64())])) as w:
        for start in range(0, 1000, 30):
            w.write_batch(pa.record_batch([pa.array(range(start, min(start + 30, 1000)))], names=["x"]))
    fs._rebatch(small, tmp_path / "big.arrow", rows=256)
    batches = list(pa.ipc.open_stream(pa.memory_map(str(tmp_path / "big.arrow"))))
    assert [b.num_rows for b in batches] == [256, 256, 256, 232] and not small.exists()
    assert pa.Table.from_batches(batches).column("x").to_pylist() == list(range(1000))
