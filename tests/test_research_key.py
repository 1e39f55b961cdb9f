"""The research key survives growth of the schema and follows the data's content, not its path;
paired randomness (``privacy.research_key=seed``) shares cohorts and noise between runs of a seed."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

import pytest
import torch

from fedpriv import schema
from fedpriv.config.resolve import resolve_config
from fedpriv.errors import ConfigError
from fedpriv.mechanisms.gaussian import GaussianNoise
from fedpriv.keys.randomness import PAIRED_NOTE
from fedpriv.keys.research_key import research_key
from fedpriv.keys.research_key import canonical_config
from fedpriv.runner import prepare
from server.app import run_local
from tests.conftest import compose_cfg
from tests.helpers import interrupt_and_resume


@dataclass
class _GrownClient(schema.Client):
    pin_memory: bool = False  # a new, unused, defaulted option field


@dataclass
class _GrownGaussian(GaussianNoise):
    warm_start: int = 0  # a new, unused, defaulted field of an option


def _smoke(tmp_path, *overrides):
    cfg = compose_cfg("+experiment=smoke", "progress=false", *overrides, run_dir=tmp_path)
    return resolve_config(cfg)


def _grow(monkeypatch) -> None:
    from fedpriv.schema import run_config

    monkeypatch.setattr(run_config, "Client", _GrownClient)  # the name RunConfig's `client` annotation reads
    monkeypatch.setitem(schema.options("mechanism"), "gaussian", _GrownGaussian())


def test_a_defaulted_field_changes_no_research_key(tmp_path, monkeypatch):
    cfg = _smoke(tmp_path / "r")
    before = research_key(cfg)
    _grow(monkeypatch)
    grown = json.loads(json.dumps(cfg))
    grown["client"]["pin_memory"] = False
    grown["mechanism"]["warm_start"] = 0
    assert research_key(grown) == before  # the new config, its fields at their defaults
    assert research_key(cfg) == before  # a config written before the fields existed
    grown["client"]["pin_memory"] = True  # set, it is part of the key
    assert research_key(grown) != before
    grown["client"]["pin_memory"] = False
    grown["mechanism"]["warm_start"] = 3
    assert research_key(grown) != before


def test_key_covers_computing_values_not_presentation_or_defaults(tmp_path):
    cfg = _smoke(tmp_path / "r")
    key = research_key(cfg)
    for presentation in ({"progress": True}, {"run_dir": "elsewhere"}, {"eval_every": 1}, {"device": "cpu"},
                         {"backend": {"name": "flower"}}, {"audit": {**cfg["audit"], "confidence": 0.5}},
                         {"client": {**cfg["client"], "parallel": 4}}):
        assert research_key({**cfg, **presentation}) == key, presentation
    for computing in ({"seed": 1}, {"rounds": 4}, {"client": {**cfg["client"], "lr": 0.5}},
                      {"optimizer": {"name": "sgd"}}, {"privacy": {**cfg["privacy"], "clip_norm": 0.25}}):
        assert research_key({**cfg, **computing}) != key, computing
    # an int in a float field is the same value; an audit inserting no canaries changes nothing
    assert research_key({**cfg, "client": {**cfg["client"], "lr": 1}}) == research_key(
        {**cfg, "client": {**cfg["client"], "lr": 1.0}})
    assert research_key({**cfg, "audit": {"canaries": 0, "support": 7, "confidence": 0.9}}) == key
    assert "run_dir" not in canonical_config(cfg) and "backend" not in canonical_config(cfg)


def test_resume_across_a_grown_schema_equals_the_uninterrupted_run(tmp_path, monkeypatch):
    full = prepare(_smoke(tmp_path / "full", "rounds=4"))
    run_local(full)

    def newer_fedpriv(cfg):  # the new version has more (defaulted) fields; the checkpoint has not
        _grow(monkeypatch)
        grown = json.loads(json.dumps(cfg))
        grown["client"]["pin_memory"] = False
        return grown

    _, resumed = interrupt_and_resume(_smoke(tmp_path / "cut", "rounds=4"), 2, before_resume=newer_fedpriv)
    assert resumed.start_round == 2 and resumed.cfg["client"]["pin_memory"] is False
    run_local(resumed)
    torch.testing.assert_close(resumed.server.params, full.server.params, rtol=0, atol=0)


def _stackoverflow(db, run_dir):
    cfg = compose_cfg("data=stackoverflow", f"data.path={db}", "data.vocab_size=5", "data.seq_len=6",
                      "model=lstm_tiny", "rounds=2", "cohort_size=2", "eval_every=2", "progress=false",
                      "privacy.target_epsilon=50", "privacy.delta=1e-3", run_dir=run_dir)
    return resolve_config(cfg)


def test_the_same_data_at_two_paths_is_one_research_run(tmp_path):
    from tests.test_stackoverflow import WORD_COUNTS, make_db

    here, linked, copied = (tmp_path / d for d in ("here", "linked", "copied"))
    for d in (here, linked, copied):
        d.mkdir()
    (here / "stackoverflow.word_count").write_text(WORD_COUNTS)
    make_db(here / "stackoverflow.sqlite")
    for name in ("stackoverflow.sqlite", "stackoverflow.word_count"):
        os.link(here / name, linked / name)  # a hard link: one file, two paths
        shutil.copy(here / name, copied / name)
    cfgs = [_stackoverflow(d / "stackoverflow.sqlite", tmp_path / f"run-{d.name}") for d in (here, linked, copied)]
    assert len({research_key(c) for c in cfgs}) == 1
    runs = [prepare(c) for c in cfgs]
    for run in runs:
        run_local(run)
    for run in runs[1:]:
        torch.testing.assert_close(run.server.params, runs[0].server.params, rtol=0, atol=0)
    # other content at the same path is another run (and a vocabulary is part of the data)
    (copied / "stackoverflow.word_count").write_text(WORD_COUNTS.replace("list\t50", "list\t55"))
    assert research_key(_stackoverflow(copied / "stackoverflow.sqlite", tmp_path / "x")) != research_key(cfgs[0])


# --- paired randomness -----------------------------------------------------------------------------

def _paired_run(tmp_path, name, *overrides):
    cfg = compose_cfg("+experiment=smoke", "progress=false", "rounds=4", "eval_every=4", "cohort_size=1",
                      "sampling=fixed", "privacy.noise_multiplier=0", "privacy.clip_norm=1e6", "ema_decay=0",
                      *overrides, run_dir=tmp_path / name)
    session = prepare(cfg)
    summary = run_local(session)
    return session, summary


def test_paired_runs_share_cohorts_and_noise_whatever_else_differs(tmp_path):
    """Zero noise, an unreachable clip, one user per round: Adam and DP-Adam (post) are the same
    optimizer, so paired runs end with the same loss; unpaired runs train on other users."""
    a, sa = _paired_run(tmp_path, "adam", "optimizer=adam", "privacy.research_key=seed")
    b, sb = _paired_run(tmp_path, "post", "optimizer=dpadam_post", "privacy.research_key=seed")
    assert sa["final"]["loss"] == sb["final"]["loss"]
    torch.testing.assert_close(a.server.params, b.server.params, rtol=0, atol=0)
    _, sc = _paired_run(tmp_path, "unpaired", "optimizer=dpadam_post")
    assert sc["final"]["loss"] != sa["final"]["loss"]
    # the same mechanism stream: paired runs with noise draw the same normals
    from fedpriv.keys.research_key import run_randomness

    keys = {run_randomness(s.cfg).noise().normal((4,)).sum().item() for s in (a, b)}
    assert len(keys) == 1


def test_every_output_of_a_paired_run_says_so(tmp_path, run_cli):
    out = tmp_path / "r"
    res = run_cli("+experiment=smoke", "rounds=1", "progress=false", "privacy.research_key=seed", f"run_dir={out}")
    assert res.returncode == 0, res.stderr
    assert PAIRED_NOTE in res.stdout
    for name in ("privacy.json", "summary.json"):
        text = (out / name).read_text()
        assert PAIRED_NOTE in text, name
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(row["mode"] == "paired" for row in rows)


@pytest.mark.parametrize("overrides", [("privacy.secure_rng=true",), ("backend=deployment",)])
def test_paired_randomness_is_refused_in_secure_mode(tmp_path, overrides):
    cfg = compose_cfg("+experiment=smoke", "privacy.research_key=seed", *overrides, run_dir=tmp_path / "r")
    with pytest.raises(ConfigError, match="research mode only"):
        prepare(cfg)
    assert not (tmp_path / "r").exists()


def test_a_research_deployments_clients_derive_the_key_of_the_servers_fitted_config(tmp_path):
    """Research mode under backend=deployment: the ClientApp composes the config from Flower's run
    config, unfitted; it must derive the research key of the server's config.yaml, whose mechanism
    defaults (BandMF's bands) are fitted to the population (issue 42, a review finding)."""
    import json

    from client.deploy import _config
    from fedpriv.keys.research_key import client_randomness
    from fedpriv.runner import prepare
    from tests.conftest import compose_cfg

    overrides = "mechanism=bandmf privacy.secure_rng=false progress=false"
    server = prepare(compose_cfg("+experiment=smoke", *overrides.split(), "backend=deployment",
                                 run_dir=tmp_path / "run"))
    assert server.spec.mechanism.bands != 16  # fitted: the experiment's default does not fit the population
    _config.cache_clear()
    spec, rng, _ = _config(json.dumps({"experiment": "smoke", "overrides": overrides, "run-dir": str(tmp_path / "run")},
                                   sort_keys=True))
    assert spec.mechanism == server.spec.mechanism
    assert rng.research == client_randomness(server.spec).research is not None
