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


# --- issue 41, edge 6: errors that name the fix ----------------------------------------------------

@pytest.mark.parametrize("bad, fix", [
    ("rounds:3", "write rounds=3"),
    ("rounds==3", "write rounds=3"),
    ("privacy.target_epsilon=[4", "privacy.target_epsilon=[a,b]"),
])
def test_a_malformed_override_inside_a_longer_line_is_named_with_its_fix(bad, fix):
    from fedpriv.compose import check_overrides

    with pytest.raises(ConfigError) as err:
        check_overrides(["+experiment=smoke", "seed=1", bad, "privacy.delta=1e-3"])
    assert f"override {bad!r}" in str(err.value) and fix in str(err.value) and "\n" not in str(err.value)


def test_a_key_without_a_value_takes_the_next_argument_in_its_fix():
    from fedpriv.compose import check_overrides

    with pytest.raises(ConfigError, match=r"override 'rounds' is not key=value; write rounds=3"):
        check_overrides(["+experiment=smoke", "rounds", "3"])


def test_a_key_given_twice_is_refused_naming_it_and_writes_nothing(run_cli, tmp_path):
    out = tmp_path / "run"
    res = run_cli("+experiment=smoke", "rounds=3", "rounds=4", f"run_dir={out}", "progress=false")
    assert res.returncode == 2, res.stderr
    line = one_error_line(res)
    assert "rounds is given twice (rounds=3 and rounds=4)" in line and "-m rounds=3,4" in line
    assert not out.exists()


def test_group_selections_experiments_and_sweeps_are_not_repeats():
    from fedpriv.compose import check_overrides

    check_overrides(["+experiment=smoke", "model=lstm", "model.hidden_size=64"])
    check_overrides(["-m", "+experiment=smoke", "seed=1,2"], multirun=True)
    check_overrides(["+experiment=smoke", "hydra.job.chdir=false", "hydra.job.chdir=true"])  # Hydra's own
    with pytest.raises(ConfigError, match=r"\+experiment=\[smoke,distill\]"):  # Hydra's rule, as before
        check_overrides(["+experiment=smoke", "+experiment=distill"])
    with pytest.raises(ConfigError, match="model is given twice"):
        check_overrides(["+experiment=smoke", "model=lstm", "model=transformer"])


def test_a_cohort_larger_than_the_population_names_the_fix(run_cli, tmp_path):
    out = tmp_path / "run"
    res = run_cli("+experiment=smoke", "cohort_size=150", f"run_dir={out}", "progress=false")
    assert res.returncode == 2, res.stderr
    line = one_error_line(res)
    assert "exceeds the population of 40 users: set cohort_size<=40" in line
    assert "data.synthetic.num_users=150 or more" in line
    assert not out.exists()


def test_resuming_a_finished_run_with_more_rounds_says_it_cannot_be_extended(run_cli, tmp_path):
    out = tmp_path / "run"
    assert run_cli("+experiment=smoke", "rounds=1", f"run_dir={out}", "progress=false").returncode == 0
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    res = run_cli("+experiment=smoke", "rounds=2", "resume=true", f"run_dir={out}", "progress=false")
    assert res.returncode == 2, res.stderr
    line = one_error_line(res)
    assert "config differs in rounds (1 -> 2): a finished run cannot be extended" in line
    assert "start a new run with rounds=2 and another run_dir" in line
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before  # nothing written


def test_resuming_an_unfinished_run_with_other_rounds_names_the_rounds_it_started_with(tmp_path):
    from fedpriv.runner import _differs_message
    from fedpriv.schema import RunConfig

    line = _differs_message(RunDirectory(tmp_path), ["rounds"], {"rounds": 5}, RunConfig(rounds=7))
    assert "resume with rounds=5, or start a new run with rounds=7 and another run_dir" in line
    other = _differs_message(RunDirectory(tmp_path), ["seed"], {"seed": 0}, RunConfig(seed=1))
    assert other.endswith("resume with the config it was started with, or use another run_dir")


# --- issue 41, edge 8: small things ----------------------------------------------------------------

def test_deploy_local_help_prints_usage_and_exits_0():
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "deploy_local.sh"
    for flag in ("--help", "-h"):
        res = subprocess.run(["bash", str(script), flag], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0 and res.stderr == "", res.stderr
        assert res.stdout.startswith("usage: scripts/deploy_local.sh --clients N") and "--round-timeout S" in res.stdout


@pytest.mark.parametrize("override,flag", [("rounds=5", "--rounds"), ("++rounds=5", "--rounds"),
                                           ("~rounds", "--rounds"), ("+backend.round_timeout=9", "--round-timeout")])
def test_deploy_local_refuses_an_override_of_a_key_its_options_set(tmp_path, override, flag):
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "deploy_local.sh"
    env = {**os.environ, "FEDPRIV_VENV_BIN": str(Path(sys.executable).parent)}
    out = tmp_path / "out"
    res = subprocess.run(["bash", str(script), "--clients", "2", "--rounds", "2", "--out", str(out), "--", override],
                         capture_output=True, text=True, timeout=30, env=env)
    assert res.returncode == 2 and f"'{override}' repeats a key {flag} sets" in res.stderr, res.stderr
    assert len(res.stderr.splitlines()) == 1 and not out.exists()


def test_sweep_members_name_themselves_on_every_stderr_line(run_cli, tmp_path):
    sweep = tmp_path / "sweep"
    res = run_cli("-m", "+experiment=smoke", "rounds=1", "privacy.delta=0.05", "seed=1,2", "progress=false",
                  f"hydra.sweep.dir={sweep}")
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    for number, seed in ((0, 1), (1, 2)):
        mine = [line for line in lines if f"[member {number}: seed={seed}] " in line]
        assert any(line.startswith(f"warning: [member {number}: seed={seed}] privacy.delta=0.05") for line in mine)
        assert any("the averaged update gets noise" in line for line in mine), lines
    assert all("[member " in line for line in lines), lines


def test_advice_goes_to_stderr_at_any_level_and_results_to_stdout():
    import logging

    from fedpriv.console import ADVICE_LOGGER, BelowLevelFilter, ConsoleFormatter, StderrFilter

    def record(name: str, level: int) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, "m", (), None)

    to_stdout, to_stderr = BelowLevelFilter(logging.WARNING), StderrFilter()
    for level in (logging.INFO, logging.WARNING):
        advice = record(ADVICE_LOGGER, level)
        assert to_stderr.filter(advice) and not to_stdout.filter(advice)
    assert to_stdout.filter(record("fedpriv.observe", logging.INFO))
    assert not to_stderr.filter(record("fedpriv.observe", logging.INFO))
    assert ConsoleFormatter().format(record(ADVICE_LOGGER, logging.INFO)) == "m"
