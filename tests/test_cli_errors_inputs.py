"""Bad input through ``python -m fedpriv.simulate``: one ``error:`` line, exit 2, nothing left behind
(C4 without a path, a refused resume under missing parents, a directory or an empty file as
StackOverflow's data.path) and error messages that quote a long reason without cutting a word."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from pathlib import Path

import pytest

from fedpriv.errors import ConfigError, DamagedFileError
from fedpriv.release.rundir import RunDirectory, short_reason


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
    from fedpriv.release.rundir import note_existing

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
    from fedpriv.config.compose import check_overrides

    with pytest.raises(ConfigError) as err:
        check_overrides(["+experiment=smoke", "seed=1", bad, "privacy.delta=1e-3"])
    assert f"override {bad!r}" in str(err.value) and fix in str(err.value) and "\n" not in str(err.value)


def test_a_key_without_a_value_takes_the_next_argument_in_its_fix():
    from fedpriv.config.compose import check_overrides

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
    from fedpriv.config.compose import check_overrides

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

    from fedpriv.release.console import ADVICE_LOGGER, BelowLevelFilter, ConsoleFormatter, StderrFilter

    def record(name: str, level: int) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, "m", (), None)

    to_stdout, to_stderr = BelowLevelFilter(logging.WARNING), StderrFilter()
    for level in (logging.INFO, logging.WARNING):
        advice = record(ADVICE_LOGGER, level)
        assert to_stderr.filter(advice) and not to_stdout.filter(advice)
    assert to_stdout.filter(record("fedpriv.release.observe", logging.INFO))
    assert not to_stderr.filter(record("fedpriv.release.observe", logging.INFO))
    assert ConsoleFormatter().format(record(ADVICE_LOGGER, logging.INFO)) == "m"


# --- issue 52, item 6: a tokenizer or vocabulary that does not fit the data never trains silently --

def _stackoverflow_args(tmp_path, *extra: str) -> tuple[str, ...]:
    from fedpriv.data.stackoverflow_writer import write_tiny_dataset

    folder = tmp_path / "so"
    folder.mkdir(exist_ok=True)
    db = write_tiny_dataset(folder)
    return ("+experiment=smoke", "data=stackoverflow", f"data.path={db}", "data.seq_len=6", "progress=false", *extra)


def test_a_hugging_face_directory_without_tokenizer_files_is_refused(run_cli, tmp_path):
    """GPT-2 from config.json and weights alone: transformers builds an empty tokenizer, on which the
    run trained to loss 0.08 and released a model (exit 0)."""
    from fedpriv.models.tiny_hf import write_model_dir

    model = write_model_dir(tmp_path / "gpt2", [f"w{i}" for i in range(1, 301)], "gpt2", hidden=16, layers=1,
                            heads=2)
    for item in model.iterdir():
        if item.name not in ("config.json", "model.safetensors"):
            item.unlink()
    out = tmp_path / "run"
    res = run_cli("+experiment=smoke", "model=hf", f"model.path={model}", "data.tokenizer=hf", f"run_dir={out}",
                  "progress=false")
    assert res.returncode == 2, res.stderr
    assert "holds no tokenizer files" in one_error_line(res)
    assert not out.exists()


def test_a_tokenizer_that_knows_no_word_of_the_test_split_is_refused(run_cli, tmp_path):
    """The smoke model's tokenizer (words w1..w300) on StackOverflow's words: every word is its unk
    token, which the accuracy leaves out (it was 0.0000 with exit 0)."""
    from fedpriv.models.tiny_hf import write_model_dir

    model = write_model_dir(tmp_path / "llama", [f"w{i}" for i in range(1, 301)], "llama", hidden=16, layers=1,
                            heads=2)
    out = tmp_path / "run"
    res = run_cli(*_stackoverflow_args(tmp_path, "model=hf", f"model.path={model}", "data.tokenizer=hf",
                                       f"run_dir={out}"))
    assert res.returncode == 2, res.stderr
    line = one_error_line(res)
    assert "every word of the test split is unknown to the tokenizer of data.tokenizer_path" in line
    assert not out.exists()


def test_a_vocabulary_covering_little_of_the_test_split_warns_and_publishes_the_share(run_cli, tmp_path):
    """4 of the 10 words: the share of unknown test words, counted here from the file itself, is
    warned about and published as a test-split statistic."""
    from fedpriv.data.stackoverflow_writer import VOCAB_FILE_NAME
    from fedpriv.data.tf_example import decode_example

    out = tmp_path / "run"
    args = _stackoverflow_args(tmp_path, "data.vocab_size=4", f"run_dir={out}")
    known = [line.split()[0] for line in (tmp_path / "so" / VOCAB_FILE_NAME).read_text().splitlines()][:4]
    with sqlite3.connect(tmp_path / "so" / "stackoverflow.sqlite") as conn:
        blobs = conn.execute("SELECT serialized_example_proto FROM examples WHERE split_name = 'test'").fetchall()
    words = [w for (blob,) in blobs for w in decode_example(blob)["tokens"][0].decode().split()]
    share = sum(w not in known for w in words) / len(words)
    assert share > 0.25
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr
    warned = [line for line in res.stderr.splitlines() if "of the test split's words are unknown" in line]
    assert len(warned) == 1 and warned[0].startswith(f"warning: {share:.0%} ")
    assert "a statistic of the test split" in warned[0]
    assert json.loads((out / "summary.json").read_text())["test_unknown_share"] == pytest.approx(share, abs=1e-12)


def test_a_word_count_file_of_binary_junk_is_one_line(run_cli, tmp_path):
    junk = tmp_path / "junk.word_count"
    junk.write_bytes(bytes(range(256)) * 20)
    out = tmp_path / "run"
    res = run_cli(*_stackoverflow_args(tmp_path, f"data.vocab_path={junk}", f"run_dir={out}"))
    assert res.returncode == 2, res.stderr
    assert "is not a word-count file" in one_error_line(res)
    assert not out.exists()


# --- issue 52, item 7: damaged inputs and impossible run directories: one line, nothing left -------

def test_a_sqlite_file_damaged_past_its_header_is_one_line(run_cli, tmp_path):
    """The schema (page 1) reads; the rows' pages do not ("database disk image is malformed": a
    traceback before)."""
    args = _stackoverflow_args(tmp_path)
    db = tmp_path / "so" / "stackoverflow.sqlite"
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big")  # the page size, in the header
    data[page:] = random.Random(0).randbytes(len(data) - page)
    db.write_bytes(bytes(data))
    out = tmp_path / "run"
    res = run_cli(*args, f"run_dir={out}")
    assert res.returncode == 2, res.stderr
    line = one_error_line(res)
    assert f"cannot read {db}" in line and "malformed" in line
    assert not out.exists()


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _nan_weights(path):
    data = bytearray(path.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")  # safetensors: a length, a JSON header, then the tensors
    data[header:] = b"\xff" * (len(data) - header)  # every float32 a NaN
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, needle", [(_truncate, "does not load as a Hugging Face causal LM"),
                                            (_nan_weights, "are not finite")], ids=["truncated", "nan"])
def test_a_damaged_model_safetensors_is_one_line(run_cli, tmp_path, damage, needle):
    from fedpriv.models.tiny_hf import write_model_dir

    model = write_model_dir(tmp_path / "llama", [f"w{i}" for i in range(1, 301)], "llama", hidden=16, layers=1,
                            heads=2)
    damage(model / "model.safetensors")
    out = tmp_path / "run"
    res = run_cli("+experiment=smoke", "model=hf", f"model.path={model}", "data.tokenizer=hf", f"run_dir={out}",
                  "progress=false")
    assert res.returncode == 2, res.stderr
    line = one_error_line(res)
    assert line.startswith(f"error: model.path '{model}'") and needle in line
    assert not out.exists()


def _unwritable_parent(tmp_path):
    """A directory this process cannot create in: read-only by its mode, or, for root (whom modes do
    not stop), sysfs."""
    ro = tmp_path / "read-only"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        (ro / "probe").mkdir()
    except PermissionError:
        return ro
    (ro / "probe").rmdir()
    try:
        (Path("/sys") / "fedpriv-probe").mkdir()
    except OSError:
        return Path("/sys")
    pytest.skip("no directory this process cannot write to")


@pytest.mark.parametrize("case", ["a file", "under a file", "in /proc", "under a read-only directory"])
def test_a_run_dir_that_cannot_be_a_directory_is_one_line_and_leaves_nothing(run_cli, tmp_path, case):
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    run_dir, code, needle = {
        "a file": (afile, 2, "is a file, not a directory"),
        "under a file": (afile / "a" / "b", 2, f"is under {afile}, which is a file"),
        "in /proc": (Path("/proc") / f"fedpriv-test-{os.getpid()}" / "run", 1, "cannot create the directory"),
        "under a read-only directory": (None, 1, "cannot create the directory"),
    }[case]
    if run_dir is None:
        run_dir = _unwritable_parent(tmp_path) / f"fedpriv-test-{os.getpid()}"
    if case == "in /proc" and not Path("/proc/self").is_dir():
        pytest.skip("no /proc")
    before = sorted(p.name for p in tmp_path.iterdir())
    res = run_cli("+experiment=smoke", f"run_dir={run_dir}", "progress=false")
    assert res.returncode == code, res.stderr
    line = one_error_line(res)
    assert str(run_dir) in line and needle in line and "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before and afile.read_text() == "mine\n"
    if case != "a file":
        assert not run_dir.exists()


def test_a_run_directory_that_cannot_be_made_removes_the_parents_made_for_it(tmp_path, monkeypatch):
    """The file system refuses the last step (simulated: EROFS once the parents exist): an
    OutputError (exit 1) and no empty parent left."""
    import errno

    from fedpriv.errors import OutputError
    from fedpriv.release.rundir import make_run_directory

    real = Path.mkdir

    def mkdir(self, mode=0o777, parents=False, exist_ok=False):
        if self.name == "run":
            real(self.parent, parents=True, exist_ok=True)
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real(self, mode, parents, exist_ok)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(OutputError, match="cannot create the directory .*run .run_dir.: Read-only file system"):
        make_run_directory(tmp_path / "a" / "b" / "run")
    assert list(tmp_path.iterdir()) == []
