"""What a run directory says beside the model (issue 41): the data's own user count only where the
neighbouring relation lets neighbours share it, and a secure run's file times."""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import compose_cfg

from fedpriv.rundir import FIXED_TIME

SMOKE = ("+experiment=smoke", "progress=false", "rounds=1")


def _numbers(value) -> list[float]:
    """Every number in a JSON value (keys aside)."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def _published(run_dir: Path) -> list:
    """privacy.json, summary.json and every metrics.jsonl row of a run."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [json.loads((run_dir / name).read_text()) for name in ("privacy.json", "summary.json")] + rows


def test_an_add_remove_run_publishes_the_public_population_only(tmp_path):
    """M3: under add/remove-one, neighbouring datasets differ in their user count, so the data's
    count (40 smoke users) and anything derived from it (8/40) must not be written; a zero-out run
    (N fixed) may state it."""
    from fedpriv.runner import prepare
    from server.app import run_local

    run_local(prepare(compose_cfg(*SMOKE, "population=50", run_dir=tmp_path / "public")))
    run_local(prepare(compose_cfg(*SMOKE, run_dir=tmp_path / "data")))
    privacy, summary, *rows = _published(tmp_path / "public")
    assert privacy["neighboring_relation"] == "add_or_remove_one"
    assert privacy["sampling"]["public_population"] == 50 and "population" not in privacy["sampling"]
    assert "population" not in summary["privacy"]["sampling"] and "num_users" not in summary
    numbers = _numbers([privacy, summary, rows])
    assert 40 not in numbers and 8 / 40 not in numbers and 50 in numbers
    privacy, summary, *_ = _published(tmp_path / "data")
    assert privacy["neighboring_relation"] == "zero_out"
    assert privacy["sampling"]["population"] == 40 and summary["num_users"] == 40


def test_a_secure_run_directory_holds_no_file_times(tmp_path):
    """L6: the files' times gave the training's wall time (the first write against the last). A
    secure run sets every file's and directory's access and modification time to FIXED_TIME; a
    research run keeps real times."""
    from fedpriv.runner import prepare
    from server.app import run_local

    for name, secure in (("secure", "true"), ("research", "false")):
        run_local(prepare(compose_cfg(*SMOKE, "rounds=2", f"privacy.secure_rng={secure}", run_dir=tmp_path / name)))
    secure_dir = tmp_path / "secure"
    paths = [secure_dir, *secure_dir.rglob("*")]
    assert {"privacy.json", "summary.json", "metrics.jsonl", "last.pt"} <= {p.name for p in paths}
    stats = {p: os.stat(p, follow_symlinks=False) for p in paths}  # stat reads no file: atimes untouched
    assert all(s.st_mtime == FIXED_TIME for s in stats.values())
    assert all(s.st_atime == FIXED_TIME for p, s in stats.items() if p.is_file())
    assert os.stat(tmp_path / "research" / "summary.json").st_mtime > FIXED_TIME + 1e9  # a real time


def test_a_path_whose_times_cannot_be_set_warns_and_never_raises(tmp_path, monkeypatch):
    """settle_times runs in train's finally: a file it may not touch (another user's) gives one
    warning, never an exception that would mask the run's own outcome."""
    import warnings

    from fedpriv import rundir

    run = rundir.RunDirectory(tmp_path / "r")
    run.path.mkdir()
    (run.path / "theirs.txt").write_text("x")
    (run.path / "ours.txt").write_text("y")
    real = os.utime

    def utime(path, *args, **kwargs):
        if str(path).endswith("theirs.txt"):
            raise PermissionError(1, "Operation not permitted")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(rundir.os, "utime", utime)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.settle_times()
    assert [str(w.message) for w in caught if "theirs.txt" in str(w.message)]
    assert os.stat(run.path / "ours.txt").st_mtime == FIXED_TIME
