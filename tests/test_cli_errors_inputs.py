"""Bad input through ``python -m fedpriv.simulate``: one ``error:`` line, exit 2, nothing left behind
(C4 without a path, a refused resume under missing parents, a directory or an empty file as
StackOverflow's data.path) and error messages that quote a long reason without cutting a word."""

from __future__ import annotations

import sqlite3
import time

import pytest

from fedpriv.errors import ConfigError, DamagedFileError
from fedpriv.rundir import RunDirectory, short_reason


def one_error_line(res) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


# --- item 6: C4 is never downloaded ---------------------------------------------------------------

def test_c4_without_a_path_fails_at_once_and_writes_nothing(run_cli, tmp_path):
    out = tmp_path / "run"
    start = time.monotonic()
    res = run_cli("+experiment=[smoke,distill]", "data.public_source=c4", f"run_dir={out}", "progress=false",
                  timeout=120)
    assert res.returncode == 2, res.stderr
    assert time.monotonic() - start < 25  # no network retries (they took 30 s)
    line = one_error_line(res)
    assert "data.public_path=" in line and "c4-train." in line and "allenai/c4" in line
    assert not out.exists()


def test_a_sweep_with_c4_without_a_path_is_refused_before_any_member_runs(run_cli, tmp_path):
    sweep = tmp_path / "sweep"
    res = run_cli("-m", "+experiment=[smoke,distill]", "data.public_source=embedded,c4", f"hydra.sweep.dir={sweep}",
                  "progress=false", timeout=120)
    assert res.returncode == 2, res.stderr
    assert "data.public_path" in one_error_line(res)
    assert not sweep.exists()


def test_the_c4_reader_never_reaches_the_hub(monkeypatch):
    import datasets

    from fedpriv.text.corpora import _documents_from_c4, public_texts

    def no_network(*args, **kwargs):
        raise AssertionError(f"datasets.load_dataset{args} called")

    monkeypatch.setattr(datasets, "load_dataset", no_network)
    for path in (None, ""):
        with pytest.raises(ConfigError, match="data.public_path"):
            public_texts("c4", path, 10)
        with pytest.raises(ConfigError, match="data.public_path"):
            next(_documents_from_c4(path))


# --- item 11 (a): a refused run removes the parents made for it -----------------------------------

def test_refused_resume_leaves_no_created_parent(run_cli, tmp_path):
    out = tmp_path / "a" / "b"
    res = run_cli("+experiment=smoke", "resume=true", f"run_dir={out}", "progress=false")
    assert res.returncode == 2, res.stderr
    assert "resume=true" in one_error_line(res)
    assert list(tmp_path.iterdir()) == []  # neither b nor the parent a made for it


def test_refused_run_keeps_parents_that_existed(run_cli, tmp_path):
    (tmp_path / "a").mkdir()  # empty, but there before the run: kept
    out = tmp_path / "a" / "b" / "c"
    res = run_cli("+experiment=smoke", "resume=true", f"run_dir={out}", "progress=false")
    assert res.returncode == 2, res.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["a"] and list((tmp_path / "a").iterdir()) == []


def test_abandon_stops_at_a_parent_that_is_not_empty(tmp_path):
    from fedpriv.rundir import note_existing

    run_dir = tmp_path / "x" / "y" / "z"
    note_existing(run_dir)
    run_dir.mkdir(parents=True)  # as Hydra does
    (tmp_path / "x" / "other").mkdir()  # another run's directory appeared meanwhile
    run = RunDirectory(run_dir).lock()
    run.created = True  # as fedpriv.simulate says: Hydra made it for this run
    run.abandon()
    assert not (tmp_path / "x" / "y").exists() and (tmp_path / "x" / "other").is_dir()


# --- item 11 (b): a long reason is shortened at a word boundary -----------------------------------

LONG = ("Error(s) in loading state_dict for LSTMLM:\n\tsize mismatch for embedding.weight: copying a param with "
        "shape torch.Size([10004, 96]) from checkpoint, the shape in current model is torch.Size([304, 96]).\n\t"
        "size mismatch for lstm.weight: copying a param with shape torch.Size([2680, 96]) from checkpoint.")


def _assert_whole_words(reason: str, original: str) -> None:
    assert reason.endswith("…") and len(reason) <= 160
    words = " ".join(original.split()).split(" ")
    kept = reason[:-1].split(" ")
    assert kept == words[:len(kept)]  # every kept word whole, none cut


def test_short_reason():
    assert short_reason(ValueError("short\nreason")) == "short reason"
    assert short_reason(KeyError()) == "KeyError"
    _assert_whole_words(short_reason(RuntimeError(LONG)), LONG)
    assert short_reason(RuntimeError("x" * 300)) == "x" * 159 + "…"  # one long word: cut, marked


def test_checkpoint_that_does_not_fit_ends_on_whole_words(tmp_path):
    from fedpriv.runner import _does_not_fit

    message = str(_does_not_fit(RunDirectory(tmp_path), RuntimeError(LONG)))
    assert message.startswith(f"checkpoint {tmp_path / 'checkpoints' / 'last.pt'} does not fit this run (")
    assert message.endswith("…); this run cannot resume from it: use another run_dir")
    _assert_whole_words(message.split(" (", 1)[1].split(");", 1)[0], LONG)


def test_damaged_checkpoint_message_ends_on_whole_words(tmp_path, monkeypatch):
    import torch

    run = RunDirectory(tmp_path)
    run.checkpoint_path.parent.mkdir()
    run.checkpoint_path.write_bytes(b"x")

    def broken(*args, **kwargs):
        raise RuntimeError(LONG)

    monkeypatch.setattr(torch, "load", broken)
    with pytest.raises(DamagedFileError) as err:
        run.load_checkpoint()
    message = str(err.value)
    assert message.endswith("…)") and "\n" not in message
    _assert_whole_words(message.split("fedpriv (", 1)[1][:-1], LONG)


# --- item 11 (c, d): StackOverflow's data.path ----------------------------------------------------

def test_a_directory_as_data_path_says_so(run_cli, tmp_path):
    out = tmp_path / "run"
    res = run_cli("+experiment=smoke", "data=stackoverflow", f"data.path={tmp_path}", f"run_dir={out}",
                  "progress=false")
    assert res.returncode == 2, res.stderr
    line = one_error_line(res)
    assert "is a directory" in line and "the sqlite file itself" in line and "stackoverflow.sqlite" in line
    assert "not found" not in line
    assert not out.exists()


def _no_tables(path):
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 1")
    return path


@pytest.mark.parametrize("make, needle", [
    (lambda p: (p.write_bytes(b""), p)[1], "empty file (0 bytes)"),
    (_no_tables, "empty sqlite database (no tables)"),
])
def test_an_empty_sqlite_file_is_called_empty(run_cli, tmp_path, make, needle):
    data = make(tmp_path / "stackoverflow.sqlite")
    out = tmp_path / "run"
    res = run_cli("+experiment=smoke", "data=stackoverflow", f"data.path={data}", f"run_dir={out}", "progress=false")
    assert res.returncode == 2, res.stderr
    line = one_error_line(res)
    assert needle in line and "no 'examples' table" in line and "lacks" not in line
    assert not out.exists()
