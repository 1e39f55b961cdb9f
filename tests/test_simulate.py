"""End to end through the Hydra entry point and the run loop: outputs, bad input, resume, backends."""

import json

import pytest
import torch

from conftest import compose_cfg
from fedpriv.release.rundir import read_jsonl
from fedpriv.runner import prepare
from fedpriv.schema import options
from helpers import interrupt_and_resume
from server.app import run_local


def test_smoke_run_writes_outputs(run_cli, tmp_path):
    out = tmp_path / "run"
    res = run_cli("+experiment=smoke", f"run_dir={out}", "progress=false")
    assert res.returncode == 0, res.stderr
    assert "final accuracy" in res.stdout and "epsilon" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 3
    assert {"accuracy", "loss"} <= set(summary["final"])
    assert {"epsilon", "delta", "accountant", "noise_multiplier"} <= set(summary["privacy"])
    assert 0 < summary["privacy"]["epsilon"] <= 50.0  # the smoke target
    assert 0 < summary["ceiling_accuracy"] < 1
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(r["epsilon"] <= 50.0 for r in rows)
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["rounds"] == 3 and privacy["epsilon"] == summary["privacy"]["epsilon"]
    assert (out / "config.yaml").exists() and (out / "checkpoints" / "last.pt").exists()


@pytest.mark.parametrize("override, needle", [
    ("privacy.target_epsilon=0", "privacy.target_epsilon"),
    ("privacy.target_epsilon=-1", "privacy.target_epsilon"),
    ("privacy.delta=1.5", "privacy.delta"),
    ("privacy.delta=0", "privacy.delta"),
    ("privacy.clip_norm=0", "privacy.clip_norm"),
    ("cohort_size=100000", "cohort_size"),
    ("model=gru", "unknown model"),
    ("mechanism=laplace", "unknown mechanism"),
    ("privacy.accountant=prv", "privacy.accountant"),
    ("rounds=0", "rounds"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(run_cli, tmp_path, override, needle):
    out = tmp_path / "run"
    res = run_cli("+experiment=smoke", f"run_dir={out}", override)
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.stderr
    assert not out.exists()


def test_missing_stackoverflow_file_says_what_to_download(run_cli, tmp_path):
    out = tmp_path / "run"
    res = run_cli("+experiment=stackoverflow", f"data.path={tmp_path}/nope.sqlite", f"run_dir={out}")
    assert res.returncode == 2
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "stackoverflow.sqlite" in lines[0]
    assert not out.exists()


def test_delta_warning_when_delta_at_least_one_over_n(tmp_path, caplog):
    cfg = compose_cfg("+experiment=smoke", "privacy.delta=0.1", run_dir=tmp_path / "r")
    with caplog.at_level("WARNING"):
        prepare(cfg)
    assert any("1/N" in r.message and "40 users" in r.message for r in caplog.records)


def test_budget_overrun_refused(tmp_path):
    from fedpriv.errors import PrivacyBudgetExceeded

    cfg = compose_cfg("+experiment=smoke", run_dir=tmp_path / "r")
    session = prepare(cfg)
    session.ledger.check_can_run(3)
    with pytest.raises(PrivacyBudgetExceeded):
        session.ledger.check_can_run(4)


@pytest.mark.parametrize("extra", [(), ("mechanism=tree", "sampling=cyclic", "optimizer=ftrl", "rounds=7"),
                                   ("mechanism=bandmf", "mechanism.bands=2", "sampling=cyclic", "rounds=7"),
                                   ("mechanism=blt", "sampling=cyclic", "rounds=7")],
                         ids=["gaussian", "tree", "bandmf", "blt"])
def test_resume_after_interruption_equals_uninterrupted(tmp_path, extra):
    overrides = ("+experiment=smoke", "rounds=4", "progress=false", *extra)
    full = prepare(compose_cfg(*overrides, run_dir=tmp_path / "full"))
    run_local(full)

    # "killed" during round 3, after round 2's checkpoint
    _, resumed = interrupt_and_resume(compose_cfg(*overrides, run_dir=tmp_path / "cut"), 2)
    assert resumed.start_round == 2
    run_local(resumed)

    torch.testing.assert_close(resumed.server.params, full.server.params, rtol=0, atol=0)
    a = json.loads((tmp_path / "full" / "privacy.json").read_text())
    b = json.loads((tmp_path / "cut" / "privacy.json").read_text())
    assert a == b

    def strip(run):
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in read_jsonl(run / "metrics.jsonl")]

    assert strip(tmp_path / "full") == strip(tmp_path / "cut")


def test_existing_run_dir_needs_resume(tmp_path):
    from fedpriv.errors import ConfigError

    cfg = compose_cfg("+experiment=smoke", "rounds=1", "progress=false", run_dir=tmp_path / "r")
    run_local(prepare(cfg))
    with pytest.raises(ConfigError, match="resume=true"):
        prepare(cfg)
    with pytest.raises(ConfigError, match="config differs in seed"):
        prepare({**cfg, "resume": True, "seed": 5})


def test_local_and_flower_backends_give_the_same_model(tmp_path):
    """Same seed → same final model on the in-process grid and Flower's simulation engine (Ray)."""
    from server.app import run_flower_simulation

    local = prepare(compose_cfg("+experiment=smoke", "progress=false", run_dir=tmp_path / "local"))
    run_local(local)
    flower = prepare(compose_cfg("+experiment=smoke", "progress=false", "backend=flower", run_dir=tmp_path / "flower"))
    summary = run_flower_simulation(flower)
    assert summary["backend"] == "flower" and summary["rounds"] == 3
    torch.testing.assert_close(flower.server.params, local.server.params, rtol=0, atol=0)
    a = json.loads((tmp_path / "local" / "privacy.json").read_text())
    b = json.loads((tmp_path / "flower" / "privacy.json").read_text())
    assert a == b


# --- issue 41, edge 8: --help says what each key means -------------------------------------------

def test_help_lists_every_key_with_its_value_and_meaning(run_cli):
    res = run_cli("+experiment=smoke", "--help")
    assert res.returncode == 0 and res.stderr == "", res.stderr
    out = res.stdout.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("keys (")) + 1
    keys = [line for line in out[start:] if line.startswith("  ")]
    assert keys and all("  # " in line for line in keys), [line for line in keys if "  # " not in line]
    assert any(line.startswith("  rounds: 3  # server rounds") for line in keys)  # the smoke value, explained
    assert any(line.startswith("  cohort_size: 8  # ") for line in keys)
    assert any(line.startswith("      vocab_size: 300  # words in the Zipf vocabulary") for line in keys)


def test_help_gives_a_runs_refusals_and_describes_a_sweeps_first_member(run_cli):
    bad = run_cli("rounds", "3", "--help")  # the refusal a run of the same line gets, naming the fix
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: override 'rounds' is not key=value; write rounds=3 (~rounds deletes a key)"], bad.stderr
    sweep = run_cli("-m", "+experiment=smoke", "rounds=5,6", "--help")
    assert sweep.returncode == 0, sweep.stderr
    assert "(its first sweep member)" in sweep.stdout
    assert any(line.startswith("  rounds: 5  # ") for line in sweep.stdout.splitlines())


def test_every_key_of_every_registered_option_has_a_meaning():
    from fedpriv.config.compose import compose_config
    from fedpriv.schema import GROUPS, describe, options, parse

    lines = describe(parse(compose_config([])))
    for group in GROUPS:
        for option in options(group).values():
            lines += describe(option, group)
    assert [line for line in lines if "  # " not in line] == []


# --- issue 41, edge 8: every field a run writes is documented in docs/OUTPUTS.md -------------------

def _documented(section: str) -> set[str]:
    """The keys the table of ``## <section>`` in docs/OUTPUTS.md lists (first column, backticked)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "OUTPUTS.md").read_text()
    body = text.split(f"\n## {section}", 1)[1].split("\n## ", 1)[0]
    return {key for row in body.splitlines() if row.startswith("| `")
            for key in re.findall(r"`([^`]+)`", row.split(" | ")[0])}


def _keys(node: dict, prefix: str = "") -> set[str]:
    """Every key of a JSON object as a dotted path (nested objects included)."""
    out = set()
    for key, value in node.items():
        out.add(prefix + key)
        if isinstance(value, dict):
            out |= _keys(value, f"{prefix}{key}.")
    return out


def _undocumented(keys: set[str], documented: set[str]) -> list[str]:
    """Keys neither listed nor under a listed ``name.*`` (an object whose keys are listed as one)."""
    def listed(key: str) -> bool:
        parts = key.split(".")
        return key in documented or any(".".join(parts[:i]) + ".*" in documented for i in range(1, len(parts) + 1))

    return sorted(k for k in keys if not listed(k) and not any(d.startswith(k + ".") for d in documented))


def _assert_documented(out) -> tuple[dict, dict, dict]:
    """Every key of the run directory ``out``'s privacy.json, summary.json, metrics.jsonl and
    diagnostics.jsonl is listed in docs/OUTPUTS.md; returns the files read."""
    privacy = json.loads((out / "privacy.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    rows = {name: [json.loads(line) for line in (out / name).read_text().splitlines()]
            for name in ("metrics.jsonl", "diagnostics.jsonl")}
    assert _undocumented(_keys(privacy), _documented("privacy.json")) == []
    assert _undocumented({k for k in _keys(summary) if not k.startswith("privacy.")},
                         _documented("summary.json")) == []
    assert set(summary["privacy"]) <= set(privacy)  # summary.json's privacy: privacy.json's keys
    for name, lines in rows.items():
        assert _undocumented(set().union(*map(_keys, lines)), _documented(name)) == [], name
    return privacy, summary, rows


def test_every_field_a_run_writes_is_in_docs_outputs(run_cli, tmp_path):
    out = tmp_path / "run"  # smoke, with the features that add fields: adaptive clipping, an audit, client DP
    res = run_cli("+experiment=smoke", "rounds=2", "privacy.clipping=adaptive", "audit.canaries=4",
                  "client.dp=example", "progress=false", f"run_dir={out}")
    assert res.returncode == 0, res.stderr
    privacy, _, _ = _assert_documented(out)
    assert privacy["rounds"] == 2 and privacy["last_round"] == 1  # the count and the 0-based index the doc states


@pytest.mark.parametrize("name", sorted(options("mechanism")))
def test_every_field_each_mechanism_writes_is_in_docs_outputs(tmp_path, name):
    """Issue 52 item 11: every registered mechanism adds its own privacy.json fields (ddgauss's
    field, grid and shares were listed nowhere while the test above saw only the Gaussian's). With
    dropouts a mechanism whose parties add the noise withholds rounds: its metrics rows say so and
    summary.json counts them (``withheld_rounds``)."""
    out = tmp_path / name
    run_local(prepare(compose_cfg("+experiment=smoke", "progress=false", f"mechanism={name}", "sampling=auto",
                                  "rounds=4", "client.dropout_rate=0.4", run_dir=out)))
    _, summary, rows = _assert_documented(out)
    if getattr(options("mechanism")[name], "client_noise", False):
        withheld = sum(1 for row in rows["metrics.jsonl"] if row.get("withheld"))
        assert summary["withheld_rounds"] == withheld > 0
    else:
        assert "withheld_rounds" not in summary
