"""Round-0 public pre-training: it helps the public loss and costs no privacy."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fedpriv.models import build_model
from fedpriv.public.pretrain import pretrain
from fedpriv.runner import prepare
from server.app import run_local
from tests.conftest import compose_cfg


def test_pretrain_lowers_public_loss_and_is_deterministic():
    rows = np.random.default_rng(0).integers(1, 30, size=(64, 9))
    rows[:, 5:] = 0
    out = []
    for _ in range(2):
        torch.manual_seed(0)
        model = build_model("lstm", 32, embed_dim=8, hidden_size=16, projection_dim=8)
        params, stats = pretrain(model, rows, steps=40, batch_size=16, lr=0.5, seed=3)
        out.append(params)
    assert stats["public_loss_last"] < stats["public_loss_first"]
    assert stats["public_sentences_used"] == 64
    torch.testing.assert_close(out[0], out[1], rtol=0, atol=0)


def test_pretraining_costs_no_privacy(tmp_path):
    common = ("+experiment=smoke", "progress=false")
    plain = prepare(compose_cfg(*common, run_dir=tmp_path / "plain"))
    run_local(plain)
    pre = prepare(compose_cfg(*common, "public.pretrain_steps=20", run_dir=tmp_path / "pre"))
    assert not torch.equal(pre.server.params, plain.task.initial_params)  # round 1 starts pre-trained
    run_local(pre)
    a = json.loads((tmp_path / "plain" / "privacy.json").read_text())
    b = json.loads((tmp_path / "pre" / "privacy.json").read_text())
    assert a == b  # same events, same noise multiplier, same epsilon
    summary = json.loads((tmp_path / "pre" / "summary.json").read_text())
    assert summary["public"]["public_sentences_used"] > 0


@pytest.mark.parametrize("value", ["-1", "1.5"])
def test_bad_pretrain_steps_exit_2(run_cli, tmp_path, value):
    proc = run_cli("+experiment=smoke", f"public.pretrain_steps={value}", f"run_dir={tmp_path / 'r'}")
    assert proc.returncode == 2 and "public.pretrain_steps" in proc.stderr


def test_pretraining_with_embedded_teacher_distillation(tmp_path):
    cfg = compose_cfg("+experiment=smoke", "progress=false", "public.pretrain_steps=10", "public.teacher=embedded",
                      "public.teacher_steps=20", "public.distill_k=4", "public.teacher_model.d_model=16",
                      "public.teacher_model.num_heads=2", "public.teacher_model.ff_dim=32",
                      run_dir=tmp_path / "run")
    session = prepare(cfg)
    assert session.stages[0].artifacts.stats["distill_k"] == 4
    corpora = list(Path(os.environ["FEDPRIV_CACHE"]).glob("distill/*-k4/index.json"))
    assert corpora, "the top-k corpus was written to the cache"
    plain = prepare(compose_cfg("+experiment=smoke", "progress=false", "public.pretrain_steps=10",
                                run_dir=tmp_path / "plain"))
    assert not torch.equal(session.server.params, plain.server.params)  # distillation changed pre-training


def test_pretrain_subset_is_seeded_sorted_and_sized():
    from fedpriv.public.setup import pretrain_subset

    np.testing.assert_array_equal(pretrain_subset(50, 1.0, 0), np.arange(50))
    a = pretrain_subset(20000, 0.01, 3)
    assert len(a) == 200 and len(set(a.tolist())) == 200 and np.all(np.diff(a) > 0)
    np.testing.assert_array_equal(a, pretrain_subset(20000, 0.01, 3))
    assert not np.array_equal(a, pretrain_subset(20000, 0.01, 4))
    assert len(pretrain_subset(10, 0.001, 0)) == 1  # never empty


def test_one_percent_with_distillation_uses_only_the_subset(tmp_path):
    """+experiment=distill: pre-training reads only its random subset (and the subset's top-k rows)."""
    from fedpriv.public.setup import pretrain_subset

    cfg = compose_cfg("+experiment=[smoke,distill]", "progress=false", "public.pretrain_steps=6",
                      "public.pretrain_fraction=0.05", "public.teacher_steps=10", "public.distill_k=3",
                      "public.teacher_model.d_model=16", "public.teacher_model.num_heads=2",
                      "public.teacher_model.ff_dim=32", run_dir=tmp_path / "run")
    assert cfg["public"]["teacher"] == "embedded"
    session = prepare(cfg)
    stats = session.stages[0].artifacts.stats
    assert stats["public_pool"] == 10 and stats["public_sentences_used"] == 10  # ceil(0.05 * 200)
    # the same subset of rows, from the same teacher top-k corpus, by hand
    rows = pretrain_subset(200, 0.05, int(cfg["seed"]))
    from fedpriv.public.distill import TopKSubset

    sub = TopKSubset(session.stages[0].artifacts.topk, rows)
    ids, values = sub.get(np.arange(10))
    full_ids, full_values = session.stages[0].artifacts.topk.get(rows)
    assert torch.equal(ids, full_ids) and torch.equal(values, full_values)


@pytest.mark.parametrize("value", ["0", "1.5"])
def test_bad_pretrain_fraction_exit_2(run_cli, tmp_path, value):
    proc = run_cli("+experiment=smoke", "public.pretrain_steps=2", f"public.pretrain_fraction={value}",
                   f"run_dir={tmp_path / 'r'}")
    assert proc.returncode == 2 and "public.pretrain_fraction" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_pretraining_is_cached_by_everything_it_depends_on(tmp_path, monkeypatch):
    """A second run of the same pre-training (a sweep over epsilon) reads the cache: the same
    initial model, without a step; another setting (the rate) or a corrupt entry trains again."""
    import fedpriv.public.setup as setup

    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cache"))
    calls = []
    real = setup.pretrain
    monkeypatch.setattr(setup, "pretrain", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    common = ("+experiment=smoke", "progress=false", "public.pretrain_steps=7")
    first = prepare(compose_cfg(*common, run_dir=tmp_path / "a")).server.params.clone()
    again = prepare(compose_cfg(*common, run_dir=tmp_path / "b")).server.params
    assert calls == [7] and torch.equal(first, again)
    other = prepare(compose_cfg(*common, "public.pretrain_lr=0.25", run_dir=tmp_path / "c")).server.params
    assert calls == [7, 7] and not torch.equal(first, other)
    for entry in (tmp_path / "cache" / "pretrained").glob("*.pt"):
        entry.write_bytes(b"not a tensor file")
    assert torch.equal(prepare(compose_cfg(*common, run_dir=tmp_path / "d")).server.params, first)
    assert calls == [7, 7, 7]
