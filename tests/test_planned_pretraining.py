"""``plan=auto`` plans round-0 public pre-training (issue 55, item 1): from public quantities only
(the public corpus' size), with the private rounds' step planned from the pre-trained start, and a
claim (privacy.json) identical to that of the same plan without pre-training."""

from __future__ import annotations

import json
import math
import os

import pytest

from fedpriv.config.resolve import run_config
from fedpriv.errors import ConfigError
from fedpriv.plan import preflight
from fedpriv.plan.auto import accounting_part
from fedpriv.plan.pretrain_plan import (A_TARGET_PRETRAINED, MAX_PRETRAIN_STEPS, MIN_PUBLIC_POOL, PRETRAIN_BATCH,
                                        PRETRAIN_EPOCHS, plan_pretraining)
from fedpriv.plan.noise_figure import A_TARGET
from tests.conftest import compose_cfg
from tests.warm_launcher import run_module

# 40 users, cohorts of 8 x 50 rounds at epsilon 2 (noise-limited), and an embedded public corpus of
# 1,200 sentences: enough for planned pre-training (the smoke corpus' 200 are not)
PUBLIC_PLAN = ("+experiment=smoke", "plan=auto", "plan.client_updates=400", "privacy.target_epsilon=2",
               "data.synthetic.num_public=1200")
POOL = 1200


def test_the_rule_reads_only_the_pools_size_and_says_why():
    steps = math.ceil(PRETRAIN_EPOCHS * 20_000 / PRETRAIN_BATCH)
    chosen = plan_pretraining(20_000, "auto", "none")
    assert chosen.planned and chosen.steps == min(steps, MAX_PRETRAIN_STEPS) and chosen.batch_size == PRETRAIN_BATCH
    assert chosen.accumulated_noise == A_TARGET_PRETRAINED < A_TARGET and "no privacy cost" in chosen.reason
    big = plan_pretraining(10 ** 7, "auto", "none")
    assert big.steps == MAX_PRETRAIN_STEPS and "capped" in big.reason
    assert plan_pretraining(20_000, "auto", "embedded").distillation
    small = plan_pretraining(MIN_PUBLIC_POOL - 1, "auto", "none")
    assert small.planned and small.steps == 0 and f"fewer than the {MIN_PUBLIC_POOL}" in small.reason
    none = plan_pretraining(None, "auto", "none")
    assert not none.planned and none.steps == 0 and "data.public_source" in none.reason
    off = plan_pretraining(20_000, "off", "none")
    assert not off.planned and off.steps == 0 and "plan.pretrain=off" in off.reason


def test_a_planned_run_pretrains_with_a_smaller_step_and_the_same_claim(tmp_path):
    """The public corpus changes the pre-training and the server step, never the private choice:
    privacy.json is the same byte for byte with and without it (plan.pretrain=off). In process (the
    run's files are written by the same code as from the command line; the command's own output is
    test_the_plan_says_what_it_chose_for_pretraining_and_why's)."""
    from fedpriv.runner import prepare
    from server.app import run_local

    runs = {}
    for name, extra in (("pre", ()), ("off", ("plan.pretrain=off",))):
        out = tmp_path / name
        run_local(prepare(compose_cfg(*PUBLIC_PLAN, *extra, "progress=false", run_dir=out)))
        runs[name] = out
    assert (runs["pre"] / "privacy.json").read_bytes() == (runs["off"] / "privacy.json").read_bytes()
    pre, off = (json.loads((runs[n] / "summary.json").read_text()) for n in ("pre", "off"))
    steps = math.ceil(PRETRAIN_EPOCHS * POOL / PRETRAIN_BATCH)
    assert pre["plan"]["public"]["steps"] == steps and off["plan"]["public"]["steps"] == 0
    assert pre["public"]["public_sentences_used"] == POOL  # the whole pool, every sentence public
    assert "public" not in off or not off["public"].get("public_sentences_used")
    for key in ("cohort_size", "rounds", "mechanism", "sampling", "noise_multiplier"):
        assert pre["plan"][key] == off["plan"][key]
    # noise-limited at epsilon 2: the step keeps a at A_TARGET_PRETRAINED instead of A_TARGET
    assert off["plan"]["prediction"]["regime"] == "noise-limited"
    assert pre["plan"]["server_lr"] == pytest.approx(off["plan"]["server_lr"] * A_TARGET_PRETRAINED / A_TARGET)
    privacy = json.loads((runs["pre"] / "privacy.json").read_text())
    assert privacy["plan"] == accounting_part(pre["plan"]) and "server_lr" not in privacy["plan"]


def test_the_pretraining_plan_reads_no_example_and_applies_again_unchanged(tmp_path):
    one = preflight(compose_cfg(*PUBLIC_PLAN, run_dir=tmp_path / "a"))
    other = preflight(compose_cfg(*PUBLIC_PLAN, "data.seed=7", run_dir=tmp_path / "b"))
    assert one.choice == other.choice and one.choice["public"]["pool"] == POOL
    spec = one.spec
    assert spec.public.pretrain_steps == one.choice["public"]["steps"] > 0
    again, choice = spec.plan.apply(spec, spec.population, one.ledger.dimension, POOL)
    assert again == spec and choice == one.choice


def test_a_typed_pretraining_setting_the_plan_replaces_is_refused_and_off_keeps_it(tmp_path):
    cfg = compose_cfg(*PUBLIC_PLAN, "public.pretrain_steps=5", run_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match=r"public\.pretrain_steps=5 \(planned: \d+\)"):
        preflight(cfg, ["public.pretrain_steps=5"])
    kept = preflight(compose_cfg(*PUBLIC_PLAN, "plan.pretrain=off", "public.pretrain_steps=5",
                                 run_dir=tmp_path / "b"), ["public.pretrain_steps=5"])
    assert kept.spec.public.pretrain_steps == 5


def test_the_plan_says_what_it_chose_for_pretraining_and_why(tmp_path):
    res = run_module("fedpriv.plan", *PUBLIC_PLAN, "--json", cwd=os.getcwd(), timeout=300)
    assert res.returncode == 0, res.stderr
    public = json.loads(res.stdout)["plan"]["public"]
    assert public["steps"] > 0 and public["pool"] == POOL and public["reason"]
    words = run_module("fedpriv.plan", *PUBLIC_PLAN, cwd=os.getcwd(), timeout=300)
    assert f"public pre-training: {public['steps']} steps of {PRETRAIN_BATCH} sentences" in words.stdout
    assert f"public.pretrain_steps={public['steps']}" in words.stdout  # in the overrides a fixed run takes
    small = run_module("fedpriv.plan", *PUBLIC_PLAN[:-1], cwd=os.getcwd(), timeout=300)
    assert "public pre-training: none (the public corpus holds 200 sentences" in small.stdout


def test_the_parsed_option_refuses_an_unknown_mode(tmp_path):
    with pytest.raises(ConfigError, match="plan.pretrain"):
        run_config(compose_cfg(*PUBLIC_PLAN, "plan.pretrain=always", run_dir=tmp_path / "r"))
