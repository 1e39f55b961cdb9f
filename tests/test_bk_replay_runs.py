"""The forward replay of Book-Keeping in a run (issue 41, M1 review): its schedule is a config key
(``client.bk_replay_every``) that reaches every engine of the run, and a refusal in a later round
ends the run with one ``error:`` line, exit 2, the rounds already published kept consistent, under
``backend=local`` and under Flower (a client reports the refusal; the server stops the run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedpriv import schema
from fedpriv.clipping.engine import REPLAY_EVERY, BookKeeping
from fedpriv.errors import ConfigError
from fedpriv.models import LSTMLanguageModel
from tests.conftest import compose_cfg

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ("+experiment=smoke", "progress=false")
MIX = {"on": False}  # the patched LSTM mixes samples while this is on (set per round)


def _mixing(forward):
    def mixing_forward(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if MIX["on"] and torch.is_grad_enabled():  # training only (evaluation runs under no_grad)
            out = out + 50 * out.detach().mean(0)  # a detached batch mean after the last layer
        return out
    return mixing_forward


def mix_from_round_2() -> None:
    """Patch this process: the LSTM LM mixes samples in the rounds after the first (backend=local)."""
    import server.app as app

    LSTMLanguageModel.forward = _mixing(LSTMLanguageModel.forward)
    round_fn_of = app.in_process_round_fn

    def patched(task, cfg, *rest):
        round_fn = round_fn_of(task, cfg, *rest)

        def mixing_round(inputs):
            MIX["on"] = inputs.round_idx >= 1
            return round_fn(inputs)
        return mixing_round

    app.in_process_round_fn = patched


@pytest.fixture
def fresh_tasks():
    from fedpriv import task as task_module

    task_module._load_task.cache_clear()  # a task built by another test has its engine already
    yield
    task_module._load_task.cache_clear()
    MIX["on"] = False


# ----------------------------------------------------------------------------- the config key


@pytest.mark.parametrize("setting", [("client.dp=example",), ("algorithm=dp_fedsgd",)], ids=["example", "fedsgd"])
@pytest.mark.parametrize("every", [None, 3])
def test_bk_replay_every_reaches_every_engine_of_the_run(tmp_path, monkeypatch, fresh_tasks, setting, every):
    from fedpriv.runner import prepare
    from server.app import run_local

    built = []
    init = BookKeeping.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(BookKeeping, "__init__", spy)
    key = () if every is None else (f"client.bk_replay_every={every}",)
    run_local(prepare(compose_cfg(*SMOKE, *setting, *key, "rounds=1", run_dir=tmp_path / "r")))
    stepped = [bk.replay_every for bk in built if bk._replay.steps]  # (the model check's engine is detached at once)
    assert stepped and set(stepped) == {REPLAY_EVERY if every is None else every}


def test_bk_replay_every_changes_no_research_key_and_is_checked(tmp_path):
    from fedpriv.config.resolve import resolve_config
    from fedpriv.keys.research_key import research_key

    cfg = resolve_config(compose_cfg(*SMOKE, run_dir=tmp_path / "r"))
    old = json.loads(json.dumps(cfg))
    del old["client"]["bk_replay_every"]  # a config written before the key existed
    assert research_key(cfg) == research_key(old)
    assert research_key({**cfg, "client": {**cfg["client"], "bk_replay_every": 1}}) == research_key(cfg)
    with pytest.raises(ConfigError, match=r"client\.bk_replay_every"):
        schema.parse(compose_cfg(*SMOKE, "client.bk_replay_every=0", run_dir=tmp_path / "z"))


# ----------------------------------------------------------------------------- a refusal in a later round


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_refusal_in_a_later_round_is_one_error_line_and_keeps_the_published_rounds(tmp_path):
    """backend=local: the engine refuses the model in round 2 (``client.bk_replay_every=1``)."""
    run_dir = tmp_path / "r"
    args = [*SMOKE, "client.dp=example", "client.bk_replay_every=1", f"run_dir={run_dir}"]
    code = ("import runpy, sys\nfrom tests.test_bk_replay_runs import mix_from_round_2\nmix_from_round_2()\n"
            f"sys.argv = ['fedpriv.simulate', *{args!r}]\nrunpy.run_module('fedpriv.simulate', run_name='__main__')\n")
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(errors) == 1, done.stderr
    assert errors[0].startswith("error: the model's output (LSTMLanguageModel): "), errors
    assert "mixes samples" in errors[0] and "the run stopped at round 2 of 3: round 1 stays published" in errors[0]
    assert [row["round"] for row in _rows(run_dir / "metrics.jsonl")] == [1]
    privacy = json.loads((run_dir / "privacy.json").read_text())
    assert privacy["rounds"] == 1, privacy
    assert not (run_dir / "summary.json").exists()


def test_a_clients_refusal_under_flower_stops_the_run(tmp_path, monkeypatch, fresh_tasks):
    """The ClientApp answers a refused model with a ``refused`` reply (the layer, no data); the
    server stops the run on it (before: the node's users were dropped and the run went on)."""
    import client.app as client_app
    from fedpriv.runner import prepare, train
    from server.app import grid_round_fn
    from server.grid import LocalGrid

    monkeypatch.setattr(LSTMLanguageModel, "forward", _mixing(LSTMLanguageModel.forward))
    reply = client_app.train_reply

    def mixing_reply(cfg, task, msg, users, rng):
        MIX["on"] = int(msg.content["config"]["round"]) >= 1
        return reply(cfg, task, msg, users, rng)

    monkeypatch.setattr(client_app, "train_reply", mixing_reply)
    session = prepare(compose_cfg(*SMOKE, "client.dp=example", "client.bk_replay_every=1", run_dir=tmp_path / "f"))
    grid = LocalGrid(client_app.make_client_app(session.cfg), num_nodes=2)
    with pytest.raises(ConfigError, match=r"^a client refused the model \(UnsupportedLayerError at the model's "
                                          r"output \(LSTMLanguageModel\)\)"):
        train(session, grid_round_fn(grid, 2, None, node_wait=1.0))
    assert session.ledger.rounds_done == 1
    assert [row["round"] for row in _rows(tmp_path / "f" / "metrics.jsonl")] == [1]
