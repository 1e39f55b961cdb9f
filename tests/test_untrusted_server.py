"""What a node accepts from a server it does not trust (client/app.py): the guarantees
docs/PRIVACY.md states *against the server* — example-level DP on clients, the parties' noise
shares of ``mechanism=ddgauss`` over SecAgg+ — hold only because the node checks what it is asked.
A server that asks for a user twice in one round, for a round again, for a SecAgg+ threshold other
than the node's plan (below ``min_shares``), or sets a party's weight, is refused or ignored: the
node never sends a second release of a user, a second noise share for a round, or a message whose
share the server scaled away. Over :class:`server.grid.LocalGrid` a node's refusal surfaces as the
exception (over a real grid, Flower sends it back as an error reply)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

import fedpriv.clients as clients
from client.app import make_client_app
from conftest import compose_cfg
from fedpriv.codec import encode
from fedpriv.runner import prepare
from fedpriv.secure_sum import party_message
from server.app import round_fn_for
from server.grid import LocalGrid
from server.strategy import assign_users

NODES = 4
SMOKE = ("+experiment=smoke", "progress=false")
DDGAUSS = (*SMOKE, "backend=flower", "aggregation=secagg", f"backend.num_supernodes={NODES}", "cohort_size=12",
           "mechanism=ddgauss", f"mechanism.shares={NODES}", "privacy.noise_multiplier=0.5")


class TamperingGrid(LocalGrid):
    """A LocalGrid whose server changes each message with ``tamper(message)`` before the node gets
    it (every node gets its own copy, as over a wire)."""

    def __init__(self, app, num_nodes: int, tamper: Callable[[Message], None]) -> None:
        super().__init__(app, num_nodes)
        self.tamper = tamper

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            mine = copy.deepcopy(msg)
            self.tamper(mine)
            ids += super().push_messages([mine])
        return ids


def _stage(msg: Message) -> str | None:
    configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
    return None if configs is None else configs.get(Key.STAGE)


def _fit_config(msg: Message) -> ConfigRecord:
    """The server's instructions in SecAgg+'s masked-vector stage (Flower's FitIns config)."""
    return msg.content.config_records["fitins.config"]


def _secure_round(tmp_path, tamper: Callable[[Message], None] = lambda msg: None, *extra: str):
    """A ddgauss session over SecAgg+ (4 nodes, 4 parties), its round-1 inputs and a round function
    over a grid whose server applies ``tamper``."""
    cfg = compose_cfg(*DDGAUSS, *extra, run_dir=tmp_path / "run")
    session = prepare(cfg)
    cohort = session.server.cohort(0)
    grid = TamperingGrid(make_client_app(cfg), NODES, tamper)
    return session, cohort, session.server.round_inputs(0, cohort), round_fn_for(session, grid, NODES, None)


def _clear_request(cfg: dict, round_idx: int, users: list[int]) -> tuple[LocalGrid, Message]:
    """A node of a clear run and the server's ``train`` message for ``users`` in ``round_idx``."""
    from fedpriv.config import run_config
    from fedpriv.task import load_task

    grid = LocalGrid(make_client_app(cfg))  # first: it sets Flower's task identity that a Message reads
    params = load_task(run_config(dict(cfg))).initial_params
    msg = Message(RecordDict({"arrays": ArrayRecord({"params": encode(params)}),
                              "config": ConfigRecord({"round": round_idx, "users": users})}),
                  dst_node_id=1, message_type="train", group_id=str(round_idx))
    return grid, msg


def _ask(grid: LocalGrid, msg: Message) -> Message:
    return grid.send_and_receive([copy.deepcopy(msg)])[0]


# ---------------------------------------------------------------- duplicate users in one request

def test_a_user_asked_twice_in_a_round_under_example_level_dp_is_refused(tmp_path):
    """client.dp=example: three copies of one user would be three noisy releases of that user in one
    round (each with fresh noise); the node refuses the request and sends no delta."""
    cfg = compose_cfg(*SMOKE, "backend=flower", "client.dp=example", run_dir=tmp_path / "r")
    grid, msg = _clear_request(cfg, 0, [3, 3, 3])
    with pytest.raises(RuntimeError, match="more than once"):
        _ask(grid, msg)
    grid, msg = _clear_request(cfg, 0, [3, 5])  # distinct users: answered
    assert set(_ask(grid, msg).content["deltas"]) == {"3", "5"}


def test_a_user_asked_twice_in_a_party_message_is_refused(tmp_path):
    """ddgauss over SecAgg+: a party told to hold one user three times would add that user's update
    three times against its one noise share (three times the sensitivity the accounting assumes)."""
    def triple(msg: Message) -> None:
        if _stage(msg) == Stage.COLLECT_MASKED_VECTORS and msg.metadata.dst_node_id == 1:
            config = _fit_config(msg)
            first = str(config["users"]).split(",")[0]
            config["users"] = ",".join([first] * 3)

    session, cohort, inputs, round_fn = _secure_round(tmp_path, triple)
    try:
        assert assign_users(cohort, list(range(1, NODES + 1)))[1], "node 1 holds a user this round"
        with pytest.raises(RuntimeError, match="more than once"):
            round_fn(inputs)
    finally:
        session.run.unlock()


# ---------------------------------------------------------------- a round asked again

def test_a_round_asked_again_is_refused_under_example_level_dp(tmp_path):
    """client.dp=example: a second answer to round 1 would be a second release of its users with
    fresh noise (the server could average the noise away); the node answers round 1 once, then round
    2, and refuses a round outside the run's rounds."""
    cfg = compose_cfg(*SMOKE, "backend=flower", "client.dp=example", "rounds=2", run_dir=tmp_path / "r")
    grid, msg = _clear_request(cfg, 0, [3])
    assert set(_ask(grid, msg).content["deltas"]) == {"3"}
    with pytest.raises(RuntimeError, match="round 1 again"):
        _ask(grid, msg)
    msg.content["config"]["round"] = 1
    assert set(_ask(grid, msg).content["deltas"]) == {"3"}
    msg.content["config"]["round"] = 2
    with pytest.raises(RuntimeError, match="this run has 2 rounds"):
        _ask(grid, msg)


def test_a_secure_round_asked_again_gets_no_second_noise_share(tmp_path):
    """ddgauss over SecAgg+: the protocol's four stages of round 1 are answered, and the round's
    sum decoded; the same round asked again (a fresh noise share from every party, were they to
    answer) is refused at its masked-vector stage, and the next round is answered."""
    session, cohort, inputs, round_fn = _secure_round(tmp_path, lambda msg: None, "rounds=2")
    try:
        assert round_fn(inputs).shares == NODES
        with pytest.raises(RuntimeError, match="round 1 again"):
            round_fn(inputs)
        assert round_fn(session.server.round_inputs(1, session.server.cohort(1))).shares == NODES
    finally:
        session.run.unlock()


# ---------------------------------------------------------------- SecAgg+ threshold and weights

@pytest.mark.parametrize("key,value,says", [
    (Key.THRESHOLD, 2, "threshold 2 of 4 shares differs"),  # min_shares is 4: a sum of 2 shares could be unmasked
    (Key.THRESHOLD, 3, "threshold 3 of 4 shares differs"),
    (Key.MAX_WEIGHT, 0.0, "max_weight 0.0 differs"),
    (Key.MAX_WEIGHT, 1000.0, "max_weight 1000.0 differs"),
])
def test_a_node_refuses_a_setup_other_than_its_plan(tmp_path, key, value, says):
    """SecAgg+'s setup names the threshold and the weight scale; the node takes both from its own
    plan (threshold: at least min_shares; weight: SECAGG_WEIGHT) and refuses a server that sends
    others before it hands over its masked vector (so no sum ever holds its message)."""
    def setup(msg: Message) -> None:
        if _stage(msg) == Stage.SETUP:
            msg.content.config_records[RECORD_KEY_CONFIGS][key] = value

    session, cohort, inputs, round_fn = _secure_round(tmp_path, setup)
    try:
        with pytest.raises(RuntimeError, match=says):
            round_fn(inputs)
    finally:
        session.run.unlock()


def test_a_threshold_below_min_shares_is_refused_with_fewer_nodes_guaranteed(tmp_path):
    """min_shares=3 of 4: the plan's threshold is 3; a server asking for 2 is refused."""
    def setup(msg: Message) -> None:
        if _stage(msg) == Stage.SETUP:
            msg.content.config_records[RECORD_KEY_CONFIGS][Key.THRESHOLD] = 2

    session, cohort, inputs, round_fn = _secure_round(tmp_path, setup, "mechanism.min_shares=3")
    try:
        with pytest.raises(RuntimeError, match="threshold 2 of 4 shares differs from this node's plan \\(threshold 3"):
            round_fn(inputs)
    finally:
        session.run.unlock()


def test_a_foreign_weight_in_the_round_cannot_scale_a_partys_share_away(tmp_path):
    """The server tells party 2 its weight is 0 in the round's instructions: the node replies with
    its own weight, so the decoded sum is exactly Σ of all four parties' messages mod m (every
    noise share in it), not the three others' sum."""
    def zero_weight(msg: Message) -> None:
        if _stage(msg) == Stage.COLLECT_MASKED_VECTORS and msg.metadata.dst_node_id == 2:
            _fit_config(msg)["max_weight"] = 0

    session, cohort, inputs, round_fn = _secure_round(tmp_path, zero_weight)
    try:
        secure = round_fn(inputs)
        codec = session.server.mechanism.codec()
        rng = clients.client_randomness(session.spec)
        round_key = session.randomness.subkey("ddgauss rotation")
        expected = torch.zeros(codec.mechanism.dim, dtype=torch.int64)
        for party, users in enumerate(assign_users(cohort, list(range(1, NODES + 1))).values()):
            expected += party_message(codec, session.task, inputs.params, users, 0, round_key, rng, party).message
        decoded = codec.decode(torch.remainder(expected, codec.modulus), round_key, 0, inputs.params.numel())
    finally:
        session.run.unlock()
    assert secure.shares == NODES and torch.equal(secure.total, decoded.to(torch.float32))
