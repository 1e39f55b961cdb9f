"""scripts/bench_files.py (data=files at StackOverflow's size) on a tiny generated file: the file it
generates (users, shuffled rows, a public word list in TFF's format) and its users-read step (cheap:
no training run; the runs it times are the plain ``fedpriv.simulate`` command)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from fedpriv.text.vocabulary import read_word_counts

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_files.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_files", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_file_has_its_users_in_no_order_and_a_public_word_list(bench, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cache"))
    made = bench.generate(tmp_path, users=60, rows=600, seed=1, parquet=True)
    lines = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert made["rows"] == len(lines) and abs(len(lines) - 600) < 60
    users = [row["user"] for row in lines]
    assert len(set(users)) == 60 and all(len(u) == 8 and u.isdigit() for u in users)
    runs = sum(a != b for a, b in zip(users, users[1:]))
    assert runs > len(lines) // 2, "rows are shuffled, not grouped by user"
    words = read_word_counts(tmp_path / "word_counts.txt", None, "data.vocab_path")
    assert words[:3] == ["w0", "w1", "w2"] and len(words) == bench.WORDS
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "rows.parquet")
    assert table.column("user").to_pylist() == users
    assert table.column("text").to_pylist() == [row["text"] for row in lines]
    read = bench.users_read(tmp_path, tmp_path / "rows.jsonl", tmp_path / "cache", [5, 20], seed=0)
    assert [r["users_read"] for r in read] == [0, 5, 20] and all(r["rss_anon_mb"] > 0 for r in read)
