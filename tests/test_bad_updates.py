"""A node that returns malformed or non-finite updates, or an error, through the real ClientApp
message path: its users are rejected or dropped and counted, never averaged in."""

from __future__ import annotations

import math

import torch
from flwr.app import Array, ArrayRecord, Error, Message
from flwr.clientapp import ClientApp

from client.app import make_client_app
from fedpriv.aggregation import clip_factor
from fedpriv.randomness import ClientRandomness
from fedpriv.clients import client_update
from fedpriv.runner import prepare
from server.app import grid_round_fn
from server.grid import LocalGrid
from tests.conftest import compose_cfg


def corrupting_app(cfg: dict) -> ClientApp:
    """Node 1 sends a NaN delta for its first user and a truncated one for its second; node 2
    answers with an error; node 3 is honest."""
    inner = make_client_app(cfg)
    app = ClientApp()

    @app.train()
    def train(msg: Message, context) -> Message:
        node = context.node_id
        if node == 2:
            return Message(Error(code=0, reason="simulated client crash"), reply_to=msg)
        reply = inner(msg, context)
        if node == 1:
            users = [str(u) for u in msg.content["config"]["users"]]
            deltas = reply.content.array_records["deltas"]
            nan = torch.full((deltas[users[0]].shape[0],), float("nan"))
            bad = dict(deltas)
            bad[users[0]] = Array(dtype="float32", shape=(nan.numel(),), stype="fedpriv.raw",
                                  data=nan.numpy().tobytes())
            bad[users[1]] = Array(dtype="float32", shape=(nan.numel(),), stype="fedpriv.raw", data=b"\x00" * 12)
            reply.content["deltas"] = ArrayRecord(bad)
        return reply

    return app


def test_bad_updates_are_rejected_or_dropped_and_counted(tmp_path):
    cfg = compose_cfg("+experiment=smoke", "progress=false", "optimizer=sgd", "ema_decay=0",
                      "privacy.noise_multiplier=0", "cohort_size=12", run_dir=tmp_path / "r")
    session = prepare(cfg)
    grid = LocalGrid(corrupting_app(cfg), num_nodes=3)
    round_fn = grid_round_fn(grid, 3, None)
    server = session.server
    before = server.params.clone()
    cohort = server.cohort(0)
    _, stats = server.apply_round(0, cohort, round_fn(server.round_inputs(0, cohort)), diagnostics=True)
    nodes = sorted(grid.get_node_ids())
    by_node = {n: [int(u) for i, u in enumerate(cohort) if nodes[i % 3] == n] for n in nodes}
    assert len(by_node[1]) >= 2 and by_node[2]
    assert stats["rejected"] == 2  # NaN and truncated: they replied, so rejected (not dropped)
    assert stats["dropped"] == len(by_node[2])  # the error reply's users
    assert stats["accepted"] == len(cohort) - 2 - len(by_node[2])
    # the step is exactly the clipped sum of the good users over the *expected* cohort size (σ = 0)
    good = by_node[1][2:] + by_node[3]
    total = torch.zeros_like(before)
    for user in good:
        delta = client_update(session.task, before, user, 0, ClientRandomness.for_config(session.cfg)).delta
        factor, _ = clip_factor(delta, server.clip_norm)
        total += factor * delta
    expected = before + total / server.sampler.expected_cohort
    torch.testing.assert_close(server.params, expected, rtol=1e-5, atol=1e-7)
    assert all(math.isfinite(v) for v in server.params.tolist())
