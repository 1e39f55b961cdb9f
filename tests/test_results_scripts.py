"""The results scripts' own logic, cheaply: their runs are ones fedpriv accepts (preflight on
the smoke data), and their tables read the rows they write."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _script(name: str):
    path = SCRIPTS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_frontier_configurations_are_runs_fedpriv_accepts(tmp_path):
    """Every configuration of scripts/frontier.py passes a run's preflight (the sampler/mechanism
    pair accounted, σ calibrated) on the smoke data, and the table/best-of logic reads rows."""
    from fedpriv.plan import preflight
    from tests.conftest import compose_cfg

    frontier = _script("frontier")
    assert len(frontier.runs()) == len(frontier.CONFIGS) * len(frontier.EPSILONS) * len(frontier.CLIPPINGS)
    for config, overrides in frontier.CONFIGS.items():
        preflight(compose_cfg("+experiment=smoke", *overrides, "privacy.mc.samples=20000",
                              run_dir=tmp_path / config))
    rows = [{"config": "gaussian-bib", "epsilon": 2, "clipping": c, "accuracy": a, "loss": 4.0,
             "noise_multiplier": 1.0, "claimed_epsilon": 2.0, "diverged": d}
            for c, a, d in (("fixed", 0.15, False), ("adaptive", 0.16, False), ("fixed1", 0.17, True))]
    assert frontier.best(rows)[("gaussian-bib", 2)]["clipping"] == "adaptive"  # a diverged run is never the best
    assert "| gaussian-bib | 2 | — | 0.1500 | 0.1700 (diverged) | 0.1600 | 1.000 | 0.1600 |" in frontier.table(rows)
    assert frontier.best(rows[2:])[("gaussian-bib", 2)]["clipping"] == "fixed1"  # unless nothing else ran
    assert 8.0 < frontier.UNIFORM_LOSS < 8.02  # ln 3004: a model worse than a uniform guess diverged


def test_memory_profile_attributes_a_stage_and_restores_the_outer_one():
    import mmap
    import time
    from types import SimpleNamespace

    profile = _script("profile_memory")
    sampler = profile.Sampler(every_mb=0.0)
    owner = SimpleNamespace()

    def work():
        with mmap.mmap(-1, 64 << 20) as block:  # fresh pages (never the allocator's resident free ones)
            block.write(b"\x01" * (64 << 20))
            time.sleep(0.1)
            return len(block)

    owner.work = work
    sampler.tag(owner, "work", "inner")
    sampler.stage = "outer"
    time.sleep(0.05)
    assert owner.work() == 64 << 20
    assert sampler.stage == "outer"
    time.sleep(0.05)
    assert sampler.peaks["inner"] >= sampler.peaks["outer"] + 50  # the block counts in the inner stage
    assert any(stage == "inner" for _, stage, _ in sampler.timeline)


def test_planner_calibration_runs_compose_and_its_rows_read_a_run(tmp_path):
    """scripts/planner_calibration.py: every run's overrides compose (known keys and options), and a
    row reads σ, the final and best test loss from a run directory and computes a = lr·C·σ·√T/(m̄(1−β)),
    refusing a mechanism whose noise is not independent Gaussian (its g is not 1)."""
    import json
    import math

    import pytest
    import yaml

    from tests.conftest import compose_cfg

    calib = _script("planner_calibration")
    todo = calib.runs(tmp_path / "stackoverflow.sqlite", 100)
    for name, overrides in todo.items():
        cfg = compose_cfg(*overrides, run_dir=tmp_path / name)
        assert cfg["mechanism"]["name"] == "gaussian" and cfg["cohort_size"] == 50, name
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"optimizer": {"lr": 0.5, "schedule": "cosine", "momentum": 0.9},
                                                    "privacy": {"clip_norm": 2.0}}))
    ledger = {"mechanism": "gaussian", "noise_multiplier": 0.6, "epsilon": 8.0, "sampling": {"expected_cohort": 50}}
    (run / "privacy.json").write_text(json.dumps(ledger))
    losses = [(10, 6.0), (20, 5.0), (30, 5.3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "test_loss": v, "test_accuracy": 0.1}) + "\n"
                                               for r, v in losses))
    (run / "summary.json").write_text(json.dumps({"rounds": 30, "degraded": True, "wall_s": 1.0}))
    row = calib.row("run", run, ["x=1"])
    assert math.isclose(row["a"], 0.5 * 2.0 * 0.6 * math.sqrt(30) / (50 * (1 - 0.9)))
    assert (row["best_loss"], row["best_round"], row["final_loss"]) == (5.0, 20, 5.3)
    assert row["degraded"] is True  # 5.3 > 1.05 x 5.0
    assert "| run | 8.00 | 0.6000 | 1 |" in calib.table([row])
    (run / "privacy.json").write_text(json.dumps({**ledger, "mechanism": "bandmf"}))
    with pytest.raises(SystemExit, match="Gaussian mechanism"):
        calib.row("run", run, [])


def test_planner_validation_runs_compose_and_its_sensitivity_runs_scale_the_planned_step(tmp_path):
    """scripts/planner_validation.py: every run's overrides compose (planned runs with plan=auto and
    a public population, the others fixed); a sensitivity run is its planned run as a fixed run with
    the plan's overrides and the server lr scaled to the asked accumulated noise."""
    import json
    import math

    from tests.conftest import compose_cfg

    val = _script("planner_validation")
    todo = val.runs(tmp_path / "stackoverflow.sqlite")
    for name, overrides in todo.items():
        cfg = compose_cfg(*overrides, run_dir=tmp_path / name)
        assert (cfg["plan"]["name"] == "auto") == ("_auto_" in name), name
        assert (cfg["population"] is not None) == ("_auto_" in name), name
        assert (cfg["privacy"]["noise_multiplier"] == 0) == ("nonprivate" in name), name
    assert val.sensitivity_runs(tmp_path, todo) == {}  # no planned run has finished
    plan = {"population": 2559, "cohort_size": 40, "rounds": 125, "mechanism": "bandmf",
            "sampling": "cyclic_poisson", "accountant": "rdp", "clip_norm": 1.0, "server_lr": 0.6,
            "momentum": 0.9, "prediction": {"accumulated_noise": 0.5}}
    (tmp_path / "B_auto_eps8").mkdir()
    (tmp_path / "B_auto_eps8" / "summary.json").write_text(json.dumps({"plan": plan}))
    extra = val.sensitivity_runs(tmp_path, todo)
    assert sorted(extra) == [f"B_auto_eps8_a{a:g}" for a in sorted(val.SENSITIVITY["B_auto_eps8"])]
    other = val.other_cohort_runs(todo)
    cfg = compose_cfg(*other["A_auto_eps2_m86"], run_dir=tmp_path / "m86")
    assert (cfg["cohort_size"], cfg["rounds"], cfg["population"]) == (86, 33000 // 86, 10000)
    assert cfg["plan"]["name"] == "fixed" and cfg["privacy"]["target_epsilon"] == 2
    for overrides in [*todo.values(), *extra.values(), *other.values()]:  # the CLI refuses a key given twice
        keys = [o.partition("=")[0] for o in overrides]
        assert len(keys) == len(set(keys)), overrides
    cfg = compose_cfg(*extra["B_auto_eps8_a1"], run_dir=tmp_path / "a1")
    assert cfg["plan"]["name"] == "fixed" and cfg["population"] == 2559 and cfg["cohort_size"] == 40
    assert cfg["mechanism"]["name"] == "bandmf" and cfg["sampling"] == "cyclic_poisson"
    assert math.isclose(cfg["optimizer"]["lr"], 0.6 * 1.0 / 0.5)
