"""The run plan and the output sink (issue 42, items 1 and 3): a frozen plan built before the run
directory is locked, without keys or files, that a run follows; and one module that writes a run's
files in its declared order (the loop writes none)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import fedpriv.release.rundir as rundir
import fedpriv.release.run_outputs as run_outputs
from fedpriv.errors import ConfigError, PrivacyBudgetExceeded
from fedpriv.plan import RunPlan, preflight
from fedpriv.runner import prepare
from server.app import run_local
from tests.conftest import compose_cfg
from tests.helpers import run_dir_files

ROOT = Path(__file__).resolve().parent.parent


def test_the_plan_is_frozen_keyless_and_writes_nothing(tmp_path):
    plan = preflight(compose_cfg("+experiment=smoke", "mechanism=bandmf", run_dir=tmp_path / "run"))
    assert isinstance(plan, RunPlan) and not (tmp_path / "run").exists()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.noise_multiplier = 0.0  # type: ignore[misc]
    assert plan.ledger.sampler.key is None and plan.ledger.mechanism._noise is None  # accounting only
    assert plan.calibrated and plan.planned_epsilon <= 50.0 * (1 + 1e-9)
    assert plan.spec.mechanism.bands != 16  # fitted to the population (the experiment's default does not fit)
    assert plan.describe()["outputs"][0] == "config.yaml" and plan.outputs[-1] == "summary.json"


@pytest.mark.parametrize("extra", [(), ("diagnostics=true", "audit.canaries=2", "tensorboard=true"),
                                   ("client.dp=example",)])
def test_a_run_follows_its_plan_and_writes_the_planned_files(tmp_path, extra):
    """The session's σ, ledger and config are the plan's; the files a run leaves are those the plan
    lists (and privacy.json states the planned ε)."""
    if "tensorboard=true" in extra:
        pytest.importorskip("tensorboard")
    cfg = compose_cfg("+experiment=smoke", "progress=false", "rounds=2", *extra, run_dir=tmp_path / "run")
    planned = preflight(cfg)
    session = prepare(cfg)
    assert session.plan.noise_multiplier == planned.noise_multiplier == session.ledger.noise_multiplier
    assert session.plan.spec == session.spec and session.ledger.sampler.key is not None
    run_local(session)
    assert run_dir_files(tmp_path / "run") == set(planned.outputs)
    assert session.ledger.to_dict()["planned_epsilon"] == pytest.approx(planned.planned_epsilon)


def test_the_sink_writes_in_the_declared_order(tmp_path, monkeypatch):
    """config.yaml first; every round its checkpoint before its published outputs; summary.json last;
    each file first written in the order the plan lists."""
    order: list[str] = []
    real = rundir.write_atomic

    def recording(path, data, **kwargs):
        order.append(Path(path).relative_to(tmp_path / "run").as_posix())
        return real(path, data, **kwargs)

    monkeypatch.setattr(rundir, "write_atomic", recording)
    monkeypatch.setattr(run_outputs, "write_atomic", recording)
    cfg = compose_cfg("+experiment=smoke", "progress=false", "rounds=2", "audit.canaries=2",
                      "diagnostics=true", run_dir=tmp_path / "run")
    session = prepare(cfg)
    run_local(session)
    published = ["metrics.jsonl", "diagnostics.jsonl", "privacy.json"]
    rounds = ["checkpoints/last.pt", *published]
    assert order == ["config.yaml", *published, *rounds, *rounds,
                     "audit_scores.json", "audit.png", "summary.json"]
    first = list(dict.fromkeys(order))
    assert first == [name for name in session.plan.outputs if name in first]


def test_the_loop_writes_no_file():
    """fedpriv/runner.py hands every write to fedpriv/release/run_outputs.py: no write call of its own."""
    source = (ROOT / "fedpriv" / "runner.py").read_text()
    writes = re.findall(r"\.(write_\w+|save_\w+|save|settle_times)\(|\b(write_json|write_atomic)\(", source)
    assert writes == []
    assert re.search(r"\.write_json\(", "run.write_json('x', {})")  # the pattern sees a write


def test_a_refused_plan_leaves_no_directory(tmp_path):
    """A cohort larger than the population, a query plan the clip rule cannot take: refused by the plan, before the
    run directory exists."""
    for bad in (("cohort_size=100000",), ("optimizer=dpadam_ime", "privacy.clipping=adaptive")):
        cfg = compose_cfg("+experiment=smoke", *bad, run_dir=tmp_path / "run")
        with pytest.raises((ConfigError, PrivacyBudgetExceeded)):
            prepare(cfg)
    assert not (tmp_path / "run").exists()


def test_a_ledger_binds_only_to_a_mechanism_that_accounts_as_planned(tmp_path):
    """The run's ledger is the plan's (its ε kept, not recomputed) bound to the keyed mechanism and
    sampler; another σ, or a ledger with recorded rounds, is refused."""
    from fedpriv.mechanisms.gaussian import GaussianMechanism

    plan = preflight(compose_cfg("+experiment=smoke", run_dir=tmp_path / "run"))
    ledger = plan.ledger
    sampler = dataclasses.replace(ledger.sampler, key=b"k" * 32)
    same = GaussianMechanism(plan.noise_multiplier, plan.mechanism_clip)
    bound = ledger.bind(same, sampler, {"mode": "research"})
    assert bound.sampler is sampler and bound.randomness == {"mode": "research"} and bound.rounds_done == 0
    assert bound._cache == ledger._cache and bound._cache is not ledger._cache
    with pytest.raises(ConfigError, match="do not account as the planned"):
        ledger.bind(GaussianMechanism(plan.noise_multiplier * 2, plan.mechanism_clip), sampler, None)
    bound.record_round(0)
    with pytest.raises(ValueError, match="planned ledger"):
        bound.bind(same, sampler, None)


def _randomness_key_calls(path) -> list[str]:
    """The calls ``<...>randomness.subkey(...)`` / ``.noise(...)`` in ``path`` (a run key's subkeys)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("subkey", "noise")):
            continue
        owner = node.func.value
        name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
        if "randomness" in name:
            found.append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno}")
    return found


def test_the_keyed_parts_are_built_in_one_place(tmp_path):
    """RunPlan.instantiate is the one construction site of the parts that hold a key of the run's
    randomness (sampler, mechanism noise, canaries, the parties' rotation, the dropouts): outside
    fedpriv/keys/ only it (and the canaries' builder it calls) derives a subkey of the run key."""
    allowed = {"fedpriv/plan/run_plan.py", "fedpriv/audit/run.py"}
    calls = [c for room in ("fedpriv", "server", "client") for p in sorted((ROOT / room).rglob("*.py"))
             if not p.relative_to(ROOT).as_posix().startswith("fedpriv/keys/")
             for c in _randomness_key_calls(p) if c.split(":")[0] not in allowed]
    assert calls == []
    assert _randomness_key_calls(ROOT / "fedpriv" / "plan" / "run_plan.py")  # the scan sees the calls it forbids
    session = prepare(compose_cfg("+experiment=smoke", "audit.canaries=4", run_dir=tmp_path / "run"))
    keyed = session.keyed
    assert session.server.sampler is keyed.sampler and session.server.mechanism is keyed.mechanism
    assert session.ledger.sampler is keyed.sampler and session.server.canaries is keyed.canaries
    assert keyed.dropout_key == session.randomness.subkey("dropout") != keyed.rotation_key
