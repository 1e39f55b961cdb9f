"""fedpriv.report: curves of one run, sweep.csv / sweep.png of a Hydra multirun."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.warm_launcher import run_module


def _report(*args):
    return run_module("fedpriv.report", *map(str, args), cwd=ROOT, timeout=120)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """A real 2 x 2 Hydra multirun of the smoke experiment, made once per test session: under
    pytest-xdist the workers' temporary directories share a parent, where the first worker to
    need it makes it (under a lock) and the others find it (the tests write distinct files)."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    out, done = root / "sweep" / "multirun", root / "sweep" / "done"
    with FileLock(str(root / "sweep.lock")):
        if not done.exists():
            proc = run_module("fedpriv.simulate", "-m", "+experiment=smoke", "progress=false", "rounds=2",
                              "eval_every=1", "privacy.target_epsilon=5,50", "optimizer=sgd,momentum",
                              f"hydra.sweep.dir={out}", cwd=ROOT, timeout=600,
                              env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0"})
            assert proc.returncode == 0, proc.stderr[-2000:]
            done.touch()
    return out


def test_sweep_csv_has_one_row_per_run_with_the_swept_values(sweep_dir):
    proc = _report(sweep_dir)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader((sweep_dir / "sweep.csv").open()))
    assert len(rows) == 4
    # the swept keys, plus any key the chosen optimizer configs differ in
    assert {"run", "optimizer.name", "privacy.target_epsilon", "final_accuracy", "final_loss", "epsilon", "delta",
            "rounds", "wall_s"} <= set(rows[0])
    assert not any(k.startswith(("data.", "model.", "client.")) for k in rows[0])  # equal in all runs
    combos = {(r["optimizer.name"], float(r["privacy.target_epsilon"])) for r in rows}
    assert combos == {("sgd", 5.0), ("sgd", 50.0), ("momentum", 5.0), ("momentum", 50.0)}
    for r in rows:
        assert float(r["epsilon"]) <= float(r["privacy.target_epsilon"]) + 1e-6 and r["rounds"] == "2"
    png = (sweep_dir / "sweep.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_curves_of_one_run(sweep_dir):
    run = sweep_dir / "0"
    proc = _report(run)
    assert proc.returncode == 0, proc.stderr
    assert (run / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_paths_exit_2(tmp_path):
    proc = _report(tmp_path / "missing")
    assert proc.returncode == 2 and proc.stderr.startswith("error:") and len(proc.stderr.splitlines()) == 1
    proc = _report(tmp_path)
    assert proc.returncode == 2 and "no finished run" in proc.stderr
    assert not (tmp_path / "sweep.csv").exists()


def test_structured_round_lines_only_when_verbose(run_cli, tmp_path):
    quiet = run_cli("+experiment=smoke", "progress=false", f"run_dir={tmp_path / 'q'}")
    assert quiet.returncode == 0 and "round=" not in quiet.stdout + quiet.stderr
    loud = run_cli("+experiment=smoke", "progress=false", "verbose=true", f"run_dir={tmp_path / 'v'}")
    assert loud.returncode == 0, loud.stderr
    lines = [line for line in loud.stdout.splitlines() if line.startswith("round=")]
    assert len(lines) == 3
    first = dict(part.split("=") for part in lines[0].split())
    # only what the epsilon covers (finding 5): no cohort size, drop/reject counts or clipped fraction
    assert set(first) == {"round", "epsilon", "mode"} and first["round"] == "1" and first["mode"] == "research"
    assert set(dict(part.split("=") for part in lines[-1].split())) == {"round", "epsilon", "mode", "test_accuracy",
                                                                          "test_loss"}


def test_tensorboard_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fedpriv.runner import prepare
    from server.app import run_local
    from tests.conftest import compose_cfg

    run_local(prepare(compose_cfg("+experiment=smoke", "progress=false", "tensorboard=true", run_dir=tmp_path / "r")))
    acc = EventAccumulator(str(tmp_path / "r" / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"epsilon", "test_accuracy"} <= tags
    assert not tags & {"clipped_fraction", "cohort_size", "train_loss", "median_update_norm", "dropped", "rejected",
                       "accepted", "wall_s"}  # statistics of training users are not published (finding 5)
    assert [e.step for e in acc.Scalars("epsilon")] == [1, 2, 3]
    assert "privacy/randomness/text_summary" in acc.Tags()["tensors"]  # the mode, as text


def test_plots_never_put_a_non_private_run_at_a_finite_epsilon(tmp_path):
    """Finding 4: a noiseless-preconditioner run is plotted as NOT PRIVATE, with its mode named."""
    from fedpriv import report
    from fedpriv.runner import prepare
    from server.app import run_local
    from tests.conftest import compose_cfg

    run_local(prepare(compose_cfg("+experiment=smoke", "progress=false", "rounds=2", "optimizer=adam_noiseless_precond",
                                  run_dir=tmp_path / "sweep" / "0")))
    run_local(prepare(compose_cfg("+experiment=smoke", "progress=false", "rounds=2", "optimizer=adam",
                                  run_dir=tmp_path / "sweep" / "1")))
    fig = report.curves_figure(tmp_path / "sweep" / "0")
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("NOT PRIVATE" in t for t in texts) and not fig.axes[2].lines
    assert "not for release" in fig._suptitle.get_text()
    swept, rows = report.sweep_rows(report.find_runs(tmp_path / "sweep"))
    assert [r["non_private"] for r in rows] == [True, False] and math.isinf(rows[0]["epsilon"])
    fig = report.sweep_figure(swept, rows)
    ax = fig.axes[0]
    assert all(math.isfinite(x) for line in ax.lines if line.get_linestyle() != "--" for x in line.get_xdata())
    assert any("NOT PRIVATE" in t.get_text() for t in ax.get_legend().get_texts())
    assert "not for release" in ax.get_title()


def test_curves_show_the_bayes_ceiling_and_epsilon_from_zero(sweep_dir):
    import json

    from fedpriv import report

    run = sweep_dir / "0"
    ceiling = json.loads((run / "summary.json").read_text())["ceiling_accuracy"]
    fig = report.curves_figure(run)
    accuracy, _, privacy = fig.axes[:3]
    lines = [line for line in accuracy.lines if line.get_label() == "Bayes ceiling"]
    assert len(lines) == 1 and lines[0].get_linestyle() == "--" and list(lines[0].get_ydata()) == [ceiling] * 2
    assert privacy.get_ylabel() == "epsilon spent" and privacy.get_ylim()[0] == 0


def test_the_sweep_says_which_runs_degraded_and_draws_the_unigram_baseline(sweep_dir):
    """Issue 52, item 9: the README's first sweep trained degraded models without saying so; sweep.csv
    carries each run's verdict and the plot marks it, with the unigram baseline its accuracy is below."""
    import json

    from fedpriv import report

    assert _report(sweep_dir).returncode == 0
    rows = {r["run"]: r for r in csv.DictReader((sweep_dir / "sweep.csv").open())}
    summaries = {run: json.loads((Path(run) / "summary.json").read_text()) for run in rows}
    for run, row in rows.items():
        summary = summaries[run]
        assert row["degraded"] == str(summary["degraded"]) and float(row["unigram_accuracy"]) == pytest.approx(
            summary["unigram_accuracy"])
        assert row["cause"] == (summary.get("degradation") or {}).get("cause", "")
    assert any(s["degraded"] for s in summaries.values())  # 2 rounds of smoke: below the unigram baseline
    fig = report.sweep_figure(*report.sweep_rows(report.find_runs(sweep_dir)))
    ax = fig.axes[0]
    by_label = {line.get_label(): line for line in ax.lines}
    unigram = next(iter(summaries.values()))["unigram_accuracy"]
    assert list(by_label["unigram baseline"].get_ydata()) == [unigram] * 2
    marked = by_label[report.DEGRADED_LABEL]
    assert len(marked.get_xdata()) == sum(s["degraded"] for s in summaries.values())
    assert report.DEGRADED_LABEL in [t.get_text() for t in ax.get_legend().get_texts()]
