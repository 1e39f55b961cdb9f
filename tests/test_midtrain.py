"""Distribution-matching mid-training: selection stats, no privacy cost, resume, bad input."""

import json

import pytest
import torch

from fedpriv import schema
from fedpriv.runner import prepare
from server.app import run_local
from tests.conftest import compose_cfg
from tests.helpers import interrupt_and_resume

SMOKE = ("+experiment=smoke", "progress=false", "rounds=4")
MID = ("public.mid_training_round=2", "public.mid_training_score=private", "public.mid_training_fraction=0.2",
       "public.mid_training_steps=5")


def test_mid_training_costs_no_privacy_and_reports_matching(tmp_path):
    plain = prepare(compose_cfg(*SMOKE, run_dir=tmp_path / "plain"))
    run_local(plain)
    mid = prepare(compose_cfg(*SMOKE, *MID, run_dir=tmp_path / "mid"))
    run_local(mid)
    a = json.loads((tmp_path / "plain" / "privacy.json").read_text())
    b = json.loads((tmp_path / "mid" / "privacy.json").read_text())
    assert a == b
    assert not torch.equal(plain.server.params, mid.server.params)
    summary = json.loads((tmp_path / "mid" / "summary.json").read_text())
    dm = summary["distribution_matching"]
    assert dm["selected"] == 40 and 0 <= dm["precision"] <= 1 and 0 < dm["base_rate"] < 1  # 20% of 200


@pytest.mark.parametrize("score", ["ratio", "sum"])
def test_mid_training_with_teacher_scores(tmp_path, score):
    cfg = compose_cfg(*SMOKE, *MID[:1], f"public.mid_training_score={score}", "public.mid_training_steps=3",
                      "public.teacher=embedded", "public.teacher_steps=10", "public.teacher_model.d_model=16",
                      "public.teacher_model.num_heads=2", "public.teacher_model.ff_dim=32", "public.distill_k=3",
                      run_dir=tmp_path / "run")
    summary = run_local(prepare(cfg))
    assert summary["distribution_matching"]["score"] == score


def test_resume_after_mid_training_equals_uninterrupted(tmp_path):
    full = prepare(compose_cfg(*SMOKE, *MID, run_dir=tmp_path / "full"))
    run_local(full)
    _, resumed = interrupt_and_resume(compose_cfg(*SMOKE, *MID, run_dir=tmp_path / "cut"), 3)
    summary = run_local(resumed)
    torch.testing.assert_close(resumed.server.params, full.server.params, rtol=0, atol=0)
    assert summary["distribution_matching"]["selected"] == 40


@pytest.mark.parametrize("override,message", [
    ("public.mid_training_round=4", "mid_training_round"),
    ("public.mid_training_round=0", "mid_training_round"),
])
def test_bad_mid_training_exit_2(run_cli, tmp_path, override, message):
    proc = run_cli(*SMOKE, override, f"run_dir={tmp_path / 'r'}")
    assert proc.returncode == 2 and message in proc.stderr


def test_mid_training_without_a_teacher_exit_2(run_cli, tmp_path):
    """Mid-training needs a public teacher (one command: it was run again in each case above)."""
    both = run_cli(*SMOKE, "public.mid_training_round=2", f"run_dir={tmp_path / 'b'}")
    assert both.returncode == 2 and "needs a public teacher" in both.stderr


def test_mid_training_round_half_and_experiment_config(tmp_path):
    from fedpriv.public.midtrain import check_mid_training

    cfg = compose_cfg("+experiment=mid_training", run_dir=tmp_path / "r")
    public = schema.load(schema.Public, cfg["public"], "public")
    assert public.mid_training_round == "half" and public.teacher == "embedded"
    assert check_mid_training(public, 220) == 110
    assert check_mid_training(public, 5) == 2
    with pytest.raises(Exception, match="mid_training_round"):
        schema.load(schema.Public, {**cfg["public"], "mid_training_round": "third"}, "public")


def test_ftrl_reset_reanchors_at_the_new_model():
    from fedpriv.optim.server import ServerFTRL

    opt = ServerFTRL(lr=0.5, momentum=0.9)
    theta = torch.zeros(4)
    for _ in range(3):
        theta = opt.step(theta, torch.ones(4))
    new = torch.full((4,), 7.0)
    opt.reset(new)
    torch.testing.assert_close(opt.step(theta, torch.zeros(4)), new, rtol=0, atol=0)
    torch.testing.assert_close(opt.step(new, torch.ones(4)), new + 0.5 * torch.ones(4), rtol=0, atol=0)


def test_mid_training_with_ftrl_keeps_the_mid_trained_model(tmp_path, monkeypatch):
    """`+experiment=mid_training optimizer=ftrl`: the rounds after T' continue from the
    mid-trained model (FTRL used to return theta_0 + lr * m_t, discarding it)."""
    import fedpriv.public.stages as stages

    marker = {}

    def fake_mid_train(task, artifacts, params, public, seed):
        marker["params"] = torch.full_like(params, 0.125)
        return marker["params"], {"selected": 1.0}

    monkeypatch.setattr(stages, "mid_train", fake_mid_train)
    cfg = compose_cfg("+experiment=smoke", "optimizer=ftrl", "optimizer.lr=1e-9", "mechanism=tree", "ema_decay=0",
                      "public.mid_training_round=2", "public.mid_training_score=private", "progress=false",
                      run_dir=tmp_path / "run")
    session = prepare(cfg)
    run_local(session)
    final = session.server.params
    assert (final - marker["params"]).abs().max() < 1e-6  # round 3 moved it by lr * m_3 only


def test_a_new_public_stage_is_its_module_only(tmp_path):
    """Extension point: a stage registered with its own settings section (public.<key>) runs as a
    hook of the loop — no edit of the loop, the schema or the stage list (docs/ARCHITECTURE.md)."""
    from dataclasses import dataclass

    from fedpriv import schema
    from fedpriv.public import stages

    @dataclass
    class Shift(schema.Section):
        at: int = 0  # 0: off
        value: float = 0.25

    class ShiftStage(stages.Stage):
        def __init__(self, at, value):
            self.at, self.value = at, value

        def after_round(self, round_done, released):
            return (torch.full_like(released, self.value), {"shifted": True}) if round_done == self.at else (None, {})

        def summary(self, history):
            return {"shifted_rounds": [row["round"] for row in history if row.get("shifted")]}

    def build(public, task, artifacts, seed, rounds):
        spec = public.shift  # the typed section the schema parsed
        return ShiftStage(spec.at, spec.value) if spec.at else None

    schema.register_section(schema.Public, "shift", Shift)
    stages.register_stage(build)
    try:
        cfg = compose_cfg("+experiment=smoke", "public.shift.at=2", "public.shift.value=0.5", "optimizer=sgd",
                          "optimizer.lr=1e-9", "ema_decay=0", "progress=false", run_dir=tmp_path / "run")
        assert cfg["public"]["shift"] == {"at": 2, "value": 0.5}
        session = prepare(cfg)
        summary = run_local(session)
        assert summary["shifted_rounds"] == [2]
        assert (session.server.params - 0.5).abs().max() < 1e-6
    finally:
        stages.BUILDERS.remove(build)
        del schema.SECTIONS[schema.Public]["shift"]
