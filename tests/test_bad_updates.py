"""A node that returns malformed or non-finite updates, or an error, through the real ClientApp
message path: its users are rejected or dropped and counted, never averaged in."""

from __future__ import annotations

import math

import torch
from flwr.app import Array, ArrayRecord, Error, Message
from flwr.clientapp import ClientApp

from client.app import make_client_app
from fedpriv.round.aggregation import clip_factor
from fedpriv.keys.research_key import client_randomness
from fedpriv.round.clients import client_update
from fedpriv.runner import prepare
from server.app import grid_round_fn
from server.grid import LocalGrid
from server.strategy import assign_users
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
    by_node = assign_users(cohort, nodes)  # user u to node u mod 3 (by id)
    assert len(by_node[1]) >= 2 and by_node[2]
    assert stats["rejected"] == 2  # NaN and truncated: they replied, so rejected (not dropped)
    assert stats["dropped"] == len(by_node[2])  # the error reply's users
    assert stats["accepted"] == len(cohort) - 2 - len(by_node[2])
    # the step is exactly the clipped sum of the good users over the *expected* cohort size (σ = 0)
    good = by_node[1][2:] + by_node[3]
    total = torch.zeros_like(before)
    for user in good:
        delta = client_update(session.task, before, user, 0, client_randomness(session.cfg)).delta
        factor, _ = clip_factor(delta, server.clip_norm)
        total += factor * delta
    expected = before + total / server.sampler.expected_cohort
    torch.testing.assert_close(server.params, expected, rtol=1e-5, atol=1e-7)
    assert all(math.isfinite(v) for v in server.params.tolist())


class DyingGrid(LocalGrid):
    """Two nodes; node 2 "is killed" after round 1: from round 2 on its messages get no reply by
    the deadline, while the grid still lists it (a SuperLink notices a dead node only after its
    heartbeat expires). Records what each round asked of which node, and the deadline."""

    def __init__(self, client_app: ClientApp) -> None:
        super().__init__(client_app, num_nodes=2)
        self.asked: list[dict[int, int]] = []  # per round: node -> number of users sent to it
        self.timeouts: list[float | None] = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.asked.append({m.metadata.dst_node_id: len(m.content["config"]["users"]) for m in messages})
        self.timeouts.append(timeout)
        live = [m for m in messages if m.metadata.dst_node_id != 2 or len(self.asked) == 1]
        return self.pull_messages(self.push_messages(live))


def test_a_node_that_stops_replying_times_out_once_and_is_skipped(tmp_path, caplog):
    """What tests/test_deploy.py's killed-SuperNode run pins, in process: the round the node dies
    in ends with its users counted as dropped and one warning naming the round and the deadline
    (no count of users: it depends on the cohort); later rounds skip the node, so there is no
    second timeout; the run completes, and no metrics row publishes a drop count."""
    from fedpriv.release.rundir import read_jsonl
    from fedpriv.runner import train

    cfg = compose_cfg("+experiment=smoke", "progress=false", "rounds=4", run_dir=tmp_path / "r")
    session = prepare(cfg)
    grid = DyingGrid(make_client_app(cfg))
    with caplog.at_level("WARNING", logger="server.app"):
        summary = train(session, grid_round_fn(grid, 2, 45))
    assert summary["rounds"] == 4
    assert grid.timeouts == [45] * 4
    assert [set(asked) for asked in grid.asked] == [{1, 2}, {1, 2}, {1}, {1}]  # rounds 3 and 4 skip node 2
    timeouts = [r.getMessage() for r in caplog.records if "did not reply within" in r.getMessage()]
    assert len(timeouts) == 1 and timeouts[0].startswith("round 2: node 2 did not reply within 45 s")
    assert "its users count as dropped" in timeouts[0]
    rows = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2, 3, 4] and not any("dropped" in r for r in rows)
    # research mode's diagnostics (never published): round 2 dropped exactly node 2's users
    dropped = [d["dropped"] for d in read_jsonl(tmp_path / "r" / "diagnostics.jsonl")]
    assert dropped == [0, grid.asked[1][2], 0, 0] and grid.asked[1][2] > 0


class SlowNodeGrid(LocalGrid):
    """Two nodes; node 2's users take ``node_seconds`` to compute (a node's time grows with its
    users' data): its reply arrives only if the server waits at least that long. Records the
    deadline each round was given."""

    def __init__(self, client_app: ClientApp, node_seconds: float) -> None:
        super().__init__(client_app, num_nodes=2)
        self.node_seconds = node_seconds
        self.timeouts: list[float | None] = []

    def send_and_receive(self, messages, *, timeout=None):
        self.timeouts.append(timeout)
        replies = self.pull_messages(self.push_messages(list(messages)))
        late = timeout is not None and timeout < self.node_seconds
        return [r for r in replies if not (late and r.metadata.src_node_id == 2)]


def test_a_deployment_waits_for_a_slow_node_by_default(tmp_path):
    """backend=deployment's defaults set no deadline: a node whose users' data takes longer than any
    fixed deadline (here 61 s, past the old 60 s default) still has its users summed, so whose
    updates a release holds never depends on how long their data takes. A deadline the operator
    sets still bounds the round (tested above)."""
    from fedpriv.config.compose import deployment_config
    from server.deploy import deployment_round_fn

    cfg = deployment_config({"experiment": "smoke", "overrides": "rounds=1 privacy.secure_rng=false",
                             "run-dir": str(tmp_path / "r")})
    session = prepare(cfg)
    assert session.spec.backend.name == "deployment"
    grid = SlowNodeGrid(make_client_app(session.cfg), node_seconds=61.0)
    try:
        cohort = session.server.cohort(0)
        replies = deployment_round_fn(session, grid)(session.server.round_inputs(0, cohort))
    finally:
        session.run.unlock()
    assert grid.timeouts == [None]
    assert assign_users(cohort, [1, 2])[2], "node 2 holds users this round"
    assert sorted(u.user for u in replies.updates) == sorted(int(u) for u in cohort)
