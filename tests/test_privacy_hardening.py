"""The printed epsilon is the epsilon delivered (issue 13): randomness modes, what the outputs
hold, and run directories that lose nothing. Each test names the finding it pins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from client.app import make_client_app
from fedpriv.errors import ConfigError, DamagedFileError, OutputError, RunDirectoryBusy
from fedpriv.release.rundir import read_jsonl
from fedpriv.runner import prepare, train
from server.app import grid_round_fn, run_local
from server.grid import LocalGrid
from tests.conftest import ROOT, compose_cfg
from tests.warm_launcher import run_module

SMOKE = ("+experiment=smoke", "progress=false")
# the only keys a metrics row may hold: quantities the ledger covers, or test-set metrics
COVERED = {"round", "epsilon", "non_private", "mode", "v_negative_fraction", "distribution_matching",
           "clip_norm", "privatized_clipped_fraction"}  # adaptive clipping: C_t (earlier releases), the private count


def _run(tmp_path, name, *overrides):
    session = prepare(compose_cfg(*SMOKE, *overrides, run_dir=tmp_path / name))
    run_local(session)
    return session


# ------------------------------------------------------------------ finding 1: noise from public data

def test_research_runs_whose_budgets_differ_share_no_noise(tmp_path):
    """2·θ(σ=1) − θ(σ=2) was the noiseless release after one round: the two runs shared z."""
    one = ("rounds=1", "optimizer=sgd", "ema_decay=0")
    a = _run(tmp_path, "a", *one, "privacy.noise_multiplier=1")
    b = _run(tmp_path, "b", *one, "privacy.noise_multiplier=2")
    clean = _run(tmp_path, "c", *one, "privacy.noise_multiplier=0")
    combined = 2 * a.server.params - b.server.params
    assert not torch.allclose(combined, clean.server.params, atol=1e-4)
    # and the streams themselves differ: another key per config
    assert a.randomness.key != b.randomness.key != clean.randomness.key
    assert not np.array_equal(a.server.sampler.sample(5), b.server.sampler.sample(5))


def test_research_mode_is_reproducible_and_says_so(tmp_path, run_cli):
    a = _run(tmp_path, "a")
    b = _run(tmp_path, "b")
    torch.testing.assert_close(a.server.params, b.server.params, rtol=0, atol=0)
    proc = run_cli(*SMOKE, "rounds=1", f"run_dir={tmp_path / 'cli'}")  # the mode's line and files: one round
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if "epsilon" in x)
    assert "research mode: randomness reproducible from the seed: not for release" in line
    for name in ("privacy.json", "summary.json"):
        text = (tmp_path / "cli" / name).read_text()
        assert "not for release" in text and '"reproducible_from_seed": true' in text


def test_secure_runs_with_one_seed_differ_in_noise_and_cohorts(tmp_path, run_cli):
    """Done-when: `+experiment=smoke privacy.secure_rng=true` twice → different noise and cohorts."""
    a = prepare(compose_cfg(*SMOKE, "privacy.secure_rng=true", run_dir=tmp_path / "a"))
    b = prepare(compose_cfg(*SMOKE, "privacy.secure_rng=true", run_dir=tmp_path / "b"))
    assert a.randomness.secure and b.randomness.key != a.randomness.key
    assert any(not np.array_equal(a.server.sampler.sample(t), b.server.sampler.sample(t)) for t in range(3))
    assert not torch.equal(a.server.mechanism.noise(0, (16,)), b.server.mechanism.noise(0, (16,)))
    run_local(a)
    run_local(b)
    assert not torch.equal(a.server.params, b.server.params)
    proc = run_cli(*SMOKE, "privacy.secure_rng=true", "rounds=1", f"run_dir={tmp_path / 'cli'}")  # its line: one round
    assert proc.returncode == 0, proc.stderr
    assert "[secure mode: randomness from the OS CSPRNG" in proc.stdout


def test_secure_key_is_only_in_the_owner_only_checkpoint(tmp_path):
    session = _run(tmp_path, "s", "privacy.secure_rng=true", "tensorboard=true", "verbose=true")
    key = session.randomness.key
    checkpoint = tmp_path / "s" / "checkpoints" / "last.pt"
    assert checkpoint.stat().st_mode & 0o077 == 0 and checkpoint.parent.stat().st_mode & 0o077 == 0
    for path in (tmp_path / "s").rglob("*"):
        if path.is_file() and path != checkpoint:
            data = path.read_bytes()
            assert key not in data and key.hex().encode() not in data, path
    # what it derives is not derivable from the published config either
    from fedpriv.keys.research_key import research_key

    assert research_key(session.cfg) != key


# ------------------------------------------------------------------ finding 2: who was sampled

def test_secure_cohorts_do_not_follow_from_the_seed(tmp_path):
    cfg = compose_cfg(*SMOKE, "privacy.secure_rng=true", run_dir=tmp_path / "a")
    a = prepare(cfg)
    replay = prepare({**compose_cfg(*SMOKE, "privacy.secure_rng=false", run_dir=tmp_path / "b")})
    cohorts = [(a.server.sampler.sample(t), replay.server.sampler.sample(t)) for t in range(10)]
    assert sum(np.array_equal(x, y) for x, y in cohorts) < 3  # an attacker's replay misses


def test_client_randomness_is_fresh_in_secure_mode():
    from fedpriv.keys.research_key import client_randomness

    secure = client_randomness({"seed": 0, "privacy": {"secure_rng": True}})
    a, b = secure.draws(3, 7), secure.draws(3, 7)
    assert a.key != b.key and not np.array_equal(a.mask_uniforms(0, 4), b.mask_uniforms(0, 4))
    assert not torch.equal(torch.rand(4, generator=a.order), torch.rand(4, generator=b.order))
    research = client_randomness({"seed": 0, "privacy": {"secure_rng": False}})
    a, b = research.draws(3, 7), research.draws(3, 7)
    assert a.key == b.key and research.draws(3, 8).key != a.key
    torch.testing.assert_close(torch.rand(4, generator=a.order), torch.rand(4, generator=b.order))
    assert "key" not in repr(a).replace("ClientDraws", "")  # never printed


# ------------------------------------------------------------------ finding 3: example-level replies

def _reply(cfg, users=(0, 1)):
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

    from fedpriv.round.codec import encode
    from fedpriv.config.resolve import run_config
    from fedpriv.task import load_task

    params = load_task(run_config(dict(cfg))).initial_params
    grid = LocalGrid(make_client_app(cfg))  # first: it sets Flower's task identity that a Message reads
    msg = Message(RecordDict({"arrays": ArrayRecord({"params": encode(params)}),
                              "config": ConfigRecord({"round": 0, "users": list(users)})}),
                  dst_node_id=1, message_type="train", group_id="0")
    return grid.send_and_receive([msg])[0].content


@pytest.mark.parametrize("overrides,metrics", [(("client.dp=example",), False), (("privacy.secure_rng=true",), False),
                                               ((), True)], ids=["example-dp", "secure", "research"])
def test_replies_carry_the_delta_and_nothing_data_dependent(tmp_path, overrides, metrics):
    content = _reply(compose_cfg(*SMOKE, *overrides, run_dir=tmp_path / "r"))
    assert set(content.array_records) == {"deltas"}
    assert bool(content.metric_records) == metrics  # only research, user-level: train loss etc. (diagnostics)


# ------------------------------------------------------------------ finding 5: published statistics

@pytest.mark.parametrize("clipping", ["fixed", "adaptive"])
def test_metrics_hold_only_covered_quantities_and_diagnostics_are_labelled(tmp_path, clipping):
    _run(tmp_path, "r", f"privacy.clipping={clipping}")
    rows = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    for row in rows:
        assert set(row) - COVERED <= {k for k in row if k.startswith("test_")}, row
    diagnostics = read_jsonl(tmp_path / "r" / "diagnostics.jsonl")
    assert len(diagnostics) == len(rows)
    assert all("NOT covered by the epsilon" in d["note"] for d in diagnostics)
    assert {"cohort_size", "clipped_fraction", "median_update_norm", "train_loss", "dropped", "rejected"} \
        <= set(diagnostics[0])


def test_secure_mode_computes_no_diagnostics(tmp_path):
    session = _run(tmp_path, "s", "privacy.secure_rng=true")
    assert session.diagnostics == [] and not (tmp_path / "s" / "diagnostics.jsonl").exists()
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert "wall_s" not in summary  # timing depends on the (secret) cohorts


def test_curves_plot_reads_no_training_statistics(tmp_path):
    from fedpriv import report

    _run(tmp_path, "r")
    (tmp_path / "r" / "diagnostics.jsonl").write_text("not json at all\n")  # never read
    assert report.report(tmp_path / "r") == [tmp_path / "r" / "curves.png"]


# ------------------------------------------------------------------ finding 6: cyclic-Poisson groups

def test_cyclic_poisson_groups_are_stable_when_users_are_added():
    from fedpriv.keys.research_key import key_from_seed
    from fedpriv.sampling import make_sampler, user_groups

    key = key_from_seed(0)
    small, large = user_groups(key, 1000, 8), user_groups(key, 1001, 8)
    np.testing.assert_array_equal(small, large[:1000])  # adding user 1000 moves nobody
    counts = np.bincount(small, minlength=8)
    assert counts.min() > 80  # and the groups stay balanced
    sampler = make_sampler("cyclic_poisson", 1000, 20, key, groups=8)
    for t in range(16):
        assert (small[sampler.sample(t)] == t % 8).all()


# ------------------------------------------------------------------ finding 8: order of writes

class Crash(RuntimeError):
    pass


def test_nothing_of_a_round_is_published_before_its_checkpoint(tmp_path, monkeypatch):
    from fedpriv.release.rundir import RunDirectory

    cfg = compose_cfg(*SMOKE, "rounds=3", run_dir=tmp_path / "r")
    session = prepare(cfg)
    original = RunDirectory.save_checkpoint

    def crash_on_round_two(self, state):
        if state["round"] == 2:
            raise Crash
        original(self, state)

    monkeypatch.setattr(RunDirectory, "save_checkpoint", crash_on_round_two)
    with pytest.raises(Crash):
        run_local(session)
    assert [r["round"] for r in read_jsonl(tmp_path / "r" / "metrics.jsonl")] == [1]
    assert json.loads((tmp_path / "r" / "privacy.json").read_text())["rounds"] == 1


def test_a_crash_after_the_checkpoint_is_republished_not_redone(tmp_path, monkeypatch):
    from fedpriv.release.rundir import RunDirectory

    full = _run(tmp_path, "full", "rounds=3")
    cfg = compose_cfg(*SMOKE, "rounds=3", run_dir=tmp_path / "cut")
    session = prepare(cfg)
    original = RunDirectory.write_metrics

    def crash_after_round_two(self, rows):
        if len(rows) == 2:
            raise Crash
        original(self, rows)

    monkeypatch.setattr(RunDirectory, "write_metrics", crash_after_round_two)
    with pytest.raises(Crash):
        run_local(session)
    monkeypatch.setattr(RunDirectory, "write_metrics", original)
    resumed = prepare({**cfg, "resume": True})
    assert resumed.start_round == 2  # round 2 is not redone: its noise is never used twice
    assert resumed.server.mechanism._noise.draws == 2
    run_local(resumed)
    torch.testing.assert_close(resumed.server.params, full.server.params, rtol=0, atol=0)
    assert (tmp_path / "cut" / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()


def test_one_atomic_write_helper_serves_every_output():
    """Every module that writes a file goes through fedpriv.release.atomic.write_atomic."""
    import re

    writers = []
    for path in (ROOT / "fedpriv").rglob("*.py"):
        if path.name == "atomic.py":
            continue
        text = path.read_text()
        if re.search(r"os\.replace\(|os\.link\(|\.write_bytes\(|\.write_text\(|torch\.save\([^)]*,\s*(tmp|path)", text):
            writers.append(path.name)
    assert writers == []


# ------------------------------------------------------------------ finding 11: the lock

def test_a_refused_second_run_touches_nothing_of_the_live_one(tmp_path, run_cli):
    cfg = compose_cfg(*SMOKE, run_dir=tmp_path / "r")
    first = prepare(cfg)
    inner = grid_round_fn(LocalGrid(make_client_app(cfg)), 1, None)
    started, release = threading.Event(), threading.Event()

    def slow(inputs):
        started.set()
        release.wait(60)
        return inner(inputs)

    worker = threading.Thread(target=train, args=(first, slow))
    worker.start()
    try:
        assert started.wait(60)  # round 1 is running: config.yaml written, checkpoints/ not yet
        for extra in ((), ("resume=true",)):
            proc = run_cli(*SMOKE, f"run_dir={tmp_path / 'r'}", *extra)
            assert proc.returncode == 2, proc.stderr
            lines = [x for x in proc.stderr.splitlines() if x.strip()]
            assert len(lines) == 1 and "in use by another fedpriv run" in lines[0]
        with pytest.raises(RunDirectoryBusy):
            prepare({**cfg, "resume": True})
    finally:
        release.set()
        worker.join(120)
    assert (tmp_path / "r" / "checkpoints" / "last.pt").exists()
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["rounds"] == 3
    assert [r["round"] for r in read_jsonl(tmp_path / "r" / "metrics.jsonl")] == [1, 2, 3]


def test_invalid_run_removes_only_what_it_created(tmp_path, run_cli):
    keep = tmp_path / "mine"
    keep.mkdir()
    proc = run_cli(*SMOKE, f"run_dir={keep}", "privacy.delta=2")
    assert proc.returncode == 2 and keep.exists()  # it existed before: never removed
    fresh = tmp_path / "fresh"
    proc = run_cli(*SMOKE, f"run_dir={fresh}", "privacy.delta=2")
    assert proc.returncode == 2 and not fresh.exists()


# ------------------------------------------------------------------ finding 12: damaged files

def _one_error_line(proc, needle):
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], proc.stderr[-2000:]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "r"
    run_local(prepare(compose_cfg(*SMOKE, run_dir=out)))
    return out


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("damage", ["garbage", "truncated", "planted-pickle", "foreign"])
def test_damaged_checkpoint_is_one_error_naming_it(tmp_path, finished_run, damage):
    run = _copy(finished_run, tmp_path / "r")
    ckpt = run / "checkpoints" / "last.pt"
    marker = tmp_path / "pwned"
    if damage == "garbage":
        ckpt.write_bytes(os.urandom(4096))
    elif damage == "truncated":
        ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    elif damage == "planted-pickle":
        import pickle

        class Exploit:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        torch.save({"format": 2, "payload": Exploit()}, ckpt, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    else:
        torch.save({"some": "other file"}, ckpt)
    with pytest.raises(DamagedFileError, match=str(ckpt)) as err:
        prepare(compose_cfg(*SMOKE, "resume=true", run_dir=run))
    assert "\n" not in str(err.value)
    assert not marker.exists()  # weights_only: a planted checkpoint cannot run code


def test_damaged_checkpoint_on_the_command_line(tmp_path, finished_run, run_cli):
    run = _copy(finished_run, tmp_path / "r")
    ckpt = run / "checkpoints" / "last.pt"
    ckpt.write_bytes(os.urandom(4096))
    _one_error_line(run_cli(*SMOKE, f"run_dir={run}", "resume=true"), str(ckpt))


def test_damaged_config_is_one_error_line_naming_it(tmp_path, finished_run, run_cli):
    run = _copy(finished_run, tmp_path / "r")
    (run / "config.yaml").write_text("rounds: [unclosed\n  - {")
    _one_error_line(run_cli(*SMOKE, f"run_dir={run}", "resume=true"), str(run / "config.yaml"))


def test_torn_metrics_are_rebuilt_on_resume_and_named_by_the_report(tmp_path, finished_run, run_cli):
    run = _copy(finished_run, tmp_path / "r")
    good = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(good[: len(good) - 25])
    proc = run_module("fedpriv.report", str(run), cwd=ROOT)
    _one_error_line(proc, str(run / "metrics.jsonl"))
    proc = run_cli(*SMOKE, f"run_dir={run}", "resume=true")
    assert proc.returncode == 0, proc.stderr
    assert (run / "metrics.jsonl").read_text() == good  # republished from the checkpoint


def test_full_disk_is_one_line_and_keeps_the_last_checkpoint(tmp_path):
    """ENOSPC while writing round 2's checkpoint: one `error:` line, exit 1, round 1 resumable."""
    run = tmp_path / "r"
    script = f"""
import errno, os, sys
import fedpriv.release.atomic as atomic
real = atomic.os.fsync
calls = {{"n": 0}}
def fsync(fd):
    if os.readlink(f"/proc/self/fd/{{fd}}").split("/")[-1].startswith(".last.pt."):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
    real(fd)
atomic.os.fsync = fsync
sys.argv = ["fedpriv.simulate", "+experiment=smoke", "progress=false", "run_dir={run}"]
from fedpriv.simulate import main
main()
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = [x for x in proc.stderr.splitlines() if x.strip() and "the averaged update gets noise" not in x]  # advice
    assert proc.returncode == 1 and len(lines) == 1 and "no space left" in lines[0] and lines[0].startswith("error:"), \
        proc.stderr[-2000:]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name != "last.pt"]  # no temporary left behind
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert state["round"] == 1
    assert [r["round"] for r in read_jsonl(run / "metrics.jsonl")] == [1]
    resumed = prepare(compose_cfg(*SMOKE, "resume=true", run_dir=run))
    assert resumed.start_round == 1
    run_local(resumed)
    reference = _run(tmp_path, "reference")
    torch.testing.assert_close(resumed.server.params, reference.server.params, rtol=0, atol=0)


def test_errors_are_config_errors_for_the_cli():
    assert issubclass(DamagedFileError, ConfigError) and issubclass(RunDirectoryBusy, ConfigError)
    assert not issubclass(OutputError, ConfigError)


def test_a_run_without_its_checkpoint_is_not_overwritten(tmp_path, finished_run, run_cli):
    """An owner who removed the (secret) checkpoint before archiving keeps the published outputs."""
    import shutil

    run = _copy(finished_run, tmp_path / "r")
    shutil.rmtree(run / "checkpoints")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    for extra in (("resume=true",), ()):
        proc = run_cli(*SMOKE, f"run_dir={run}", *extra)
        _one_error_line(proc, str(run))
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_a_private_vocabulary_makes_the_run_non_private(tmp_path, monkeypatch):
    """A vocabulary counted on the private train split is not accounted: every output says inf."""
    import fedpriv.task as task_module

    real = task_module._load_words

    def private_vocabulary(data_cfg):
        data = real(data_cfg)
        data.info["non_private_reason"] = "the word vocabulary was counted on the private train split"
        return data

    monkeypatch.setattr(task_module, "_load_words", private_vocabulary)
    task_module._load_task.cache_clear()
    try:
        session = _run(tmp_path, "r", "seed=3")  # a task key of its own
    finally:
        task_module._load_task.cache_clear()
    privacy = json.loads((tmp_path / "r" / "privacy.json").read_text())
    assert privacy["epsilon"] is None and privacy["non_private"] is True
    assert "private train split" in privacy["non_private_reason"]
    assert session.ledger.reported_epsilon() == float("inf")
