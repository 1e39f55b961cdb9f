"""What a node accepts from a server it does not trust (client/app.py): the guarantees
docs/PRIVACY.md states *against the server* — example-level DP on clients, the parties' noise
shares of ``mechanism=ddgauss`` over SecAgg+ — hold only because the node checks what it is asked.
A server that asks for a user twice in one round or for an id outside the node's data (``-37``
indexed user 3 again), for a round again (also in a new Flower run: a deployed node in secure mode
remembers its rounds on its own disk), for a SecAgg+ threshold other than the node's plan (below
``min_shares``), or sets a party's weight, is refused or ignored: the node never sends a second
release of a user, a second noise share for a round, or a message whose share the server scaled
away. Over :class:`server.grid.LocalGrid` a node's refusal surfaces as the exception, or with
``error_replies`` as the error reply a SuperNode sends."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

import client.app as client_app
import client.deploy as deployed_node
import fedpriv.round.clients as clients
from client.app import make_client_app
from conftest import compose_cfg
from fedpriv.round.codec import decode, encode
from fedpriv.config.compose import deployment_config
from fedpriv.config.resolve import run_config
from fedpriv.runner import prepare, train
from fedpriv.sums.secure_sum import party_message
from fedpriv.task import load_task
from server.app import round_fn_for
from server.deploy import deployment_round_fn, server_config
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


def _train_message(cfg: dict, round_idx: int, users: list[int]) -> Message:
    """The server's ``train`` message of a clear run ``cfg`` for ``users`` in ``round_idx`` (to node
    1; a grid made first sets Flower's task identity that a Message reads)."""
    params = load_task(run_config(dict(cfg))).initial_params
    return Message(RecordDict({"arrays": ArrayRecord({"params": encode(params)}),
                               "config": ConfigRecord({"round": round_idx, "users": users})}),
                   dst_node_id=1, message_type="train", group_id=str(round_idx))


def _clear_request(cfg: dict, round_idx: int, users: list[int], **grid) -> tuple[LocalGrid, Message]:
    """A node of a clear run and the server's ``train`` message for ``users`` in ``round_idx``."""
    node = LocalGrid(make_client_app(cfg), **grid)  # first: it sets Flower's task identity that a Message reads
    return node, _train_message(cfg, round_idx, users)


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


# ---------------------------------------------------------------- user ids outside the node's data

@pytest.mark.parametrize("users", [[3, -37], [3, -1], [3, 40], [40]], ids=["-37", "-1", "40", "40-alone"])
def test_a_user_id_outside_the_population_is_refused(tmp_path, users):
    """Smoke data has 40 users: ``-37`` indexed user 3 again (Python's negative index), so [3, -37]
    was two noisy releases of user 3 in one round; 40 is no user. The node checks every id against
    its data before the duplicate check and before computing anything; the round stays unanswered,
    and a request for real users is answered."""
    cfg = compose_cfg(*SMOKE, "backend=flower", "client.dp=example", run_dir=tmp_path / "r")
    grid, msg = _clear_request(cfg, 0, users)
    with pytest.raises(RuntimeError, match="not a user of this node's data"):
        _ask(grid, msg)
    msg.content["config"]["users"] = [3, 5]
    assert set(_ask(grid, msg).content["deltas"]) == {"3", "5"}


@pytest.mark.parametrize("ids", [lambda first: f"{first},{first - 40}", lambda first: f"{first},40"],
                         ids=["negative", "population"])
def test_a_user_id_outside_the_population_in_a_party_message_is_refused(tmp_path, ids):
    """ddgauss over SecAgg+: a party told to hold user u and ``u − 40`` (or 40, no user) would add
    u's update twice against its one noise share; the node refuses the masked-vector stage."""
    def alias(msg: Message) -> None:
        if _stage(msg) == Stage.COLLECT_MASKED_VECTORS and msg.metadata.dst_node_id == 1:
            config = _fit_config(msg)
            config["users"] = ids(int(str(config["users"]).split(",")[0]))

    session, cohort, inputs, round_fn = _secure_round(tmp_path, alias)
    try:
        assert assign_users(cohort, list(range(1, NODES + 1)))[1], "node 1 holds a user this round"
        with pytest.raises(RuntimeError, match="not a user"):
            round_fn(inputs)
    finally:
        session.run.unlock()


def test_a_refused_request_computes_nothing_and_is_an_error_reply(tmp_path, monkeypatch):
    """docs/PRIVACY.md: "A refusal is an error reply: nothing of the request is computed or sent".
    Over a grid that answers as a SuperNode does, each refused clear request (a user twice, a user
    outside the data, a round outside the run, a round again) comes back as an error reply with no
    content, and no client update is computed for it; a valid request computes its users."""
    computed: list[list[int]] = []
    real = clients.iter_client_updates

    def spy(task, params, users, *args, **kwargs):
        computed.append(list(users))
        return real(task, params, users, *args, **kwargs)

    monkeypatch.setattr(clients, "iter_client_updates", spy)
    cfg = compose_cfg(*SMOKE, "backend=flower", "client.dp=example", "rounds=2", run_dir=tmp_path / "r")
    grid, msg = _clear_request(cfg, 0, [3], error_replies=True)
    answered = _ask(grid, msg)
    assert not answered.has_error() and set(answered.content["deltas"]) == {"3"} and computed == [[3]]
    computed.clear()
    for round_idx, users, says in [(1, [3, 3], "more than once"), (1, [3, -37], "user -37"), (2, [3], "2 rounds"),
                                   (0, [5], "round 1 again")]:
        msg.content["config"]["round"], msg.content["config"]["users"] = round_idx, users
        refused = _ask(grid, msg)
        assert refused.has_error() and not refused.has_content() and says in refused.error.reason
    assert computed == []


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


# ---------------------------------------------------------------- the node's memory beyond one Flower run

def _deployment(tmp_path, overrides: str, nodes: int = 1):
    """The Flower run config ``scripts/deploy_local.sh`` would pass (smoke, ``overrides``), and a
    factory of in-process grids of the deployed ClientApp (client/deploy.py) for a Flower run id:
    node n keeps its state in ``tmp_path/nodes/n`` whatever the run, and a node's exception comes
    back as the error reply a SuperNode sends."""
    config = {"experiment": "smoke", "overrides": f"backend.num_supernodes={nodes} {overrides}",
              "run-dir": str(tmp_path / "run")}

    def grid(run_id: int, run: dict = config) -> LocalGrid:
        return LocalGrid(deployed_node.app, nodes, run_id=run_id, run_config=run, error_replies=True,
                         node_config=lambda n: {"state-dir": str(tmp_path / "nodes" / str(n))})

    return config, grid


def test_a_round_answered_in_an_earlier_flower_run_of_the_config_is_refused(tmp_path):
    """Secure mode (the deployments' default): the node remembers the rounds it answered on its own
    disk, under the digest of the run's config, so neither a new Flower run id nor a restarted
    SuperNode (a fresh Context for the same run) gets round 1 again, with fresh noise; a run of
    another config (another seed) is answered."""
    config, grid = _deployment(tmp_path, "client.dp=example rounds=2")
    spec = run_config(deployment_config(config))
    assert spec.secure
    first = grid(run_id=1)
    msg = _train_message(deployment_config(config), 0, [3])
    assert set(_ask(first, msg).content["deltas"]) == {"3"}
    assert "round 1 again" in _ask(grid(run_id=2), msg).error.reason  # a new Flower run of the same config
    msg.content["config"]["round"] = 1
    assert set(_ask(grid(run_id=2), msg).content["deltas"]) == {"3"}  # the next round is answered once
    assert "round 2 again" in _ask(grid(run_id=2), msg).error.reason  # the SuperNode restarted: same run id
    other = {**config, "overrides": f"{config['overrides']} seed=1"}
    msg.content["config"]["round"] = 0
    assert set(_ask(grid(run_id=3, run=other), msg).content["deltas"]) == {"3"}
    assert sorted(p.name for p in (tmp_path / "nodes" / "1" / "answered").iterdir()) == sorted(
        [client_app.config_digest(deployed_node._config(json.dumps(c, sort_keys=True, default=str))[0])
         for c in (config, other)])


def test_in_research_mode_a_round_asked_again_in_a_new_run_releases_nothing_new(tmp_path):
    """Research mode keeps no memory on disk: a client's draws are keyed by (research key, round,
    user), and the research key is a digest of the config the server holds, so a round asked again
    in a new Flower run returns the same bits — and the server could compute that noise itself."""
    config, grid = _deployment(tmp_path, "client.dp=example rounds=2 privacy.secure_rng=false")
    first_run = grid(run_id=1)
    msg = _train_message(deployment_config(config), 0, [3])
    first, again = _ask(first_run, msg), _ask(grid(run_id=2), msg)
    assert torch.equal(decode(first.content["deltas"]["3"]), decode(again.content["deltas"]["3"]))
    assert not (tmp_path / "nodes").exists()


def test_a_resumed_run_whose_nodes_refuse_the_round_they_answered_drops_its_users(tmp_path, caplog):
    """The server crashes after its nodes answered round 2, before the round's checkpoint; the
    resumed run (a new Flower run) asks round 2 again. The nodes refuse (they remember it on their
    disks), and the server counts that round's users as dropped — it fails closed, never crashes —
    and finishes the run, whose next round the nodes answer."""
    config, grid = _deployment(tmp_path, "rounds=3 cohort_size=20", nodes=2)
    cfg = {**server_config(config), "progress": False}
    first = prepare(cfg)
    inner = deployment_round_fn(first, grid(run_id=1))

    def replies_then_crash(inputs):
        replies = inner(inputs)
        if inputs.round_idx == 1:
            assert replies.updates, "round 2's cohort has users"
            raise KeyboardInterrupt  # after the replies, before the round's checkpoint
        return replies

    with pytest.raises(KeyboardInterrupt):
        train(first, replies_then_crash)
    resumed = prepare({**cfg, "resume": True})
    assert resumed.start_round == 1
    again = deployment_round_fn(resumed, grid(run_id=2))
    got: dict[int, int] = {}

    def noting(inputs):
        replies = again(inputs)
        got[inputs.round_idx] = len(replies.updates)
        return replies

    with caplog.at_level("WARNING", logger="server.strategy"):
        summary = train(resumed, noting)
    assert summary["rounds"] == 3 and got[1] == 0 and got[2] > 0
    refusals = [r.getMessage() for r in caplog.records if "failed its users" in r.getMessage()]
    assert len(refusals) == 2 and all("(RuntimeError;" in line for line in refusals)


def test_a_resumed_secure_round_the_parties_answered_is_withheld(tmp_path):
    """ddgauss over SecAgg+, deployed nodes: round 1 answered in one Flower run; asked again in a new
    one, every party refuses its masked vector (no second noise share), the protocol halts and the
    round holds no share and no user; round 2 is then answered by every party."""
    overrides = " ".join(o for o in DDGAUSS if "=" in o and not o.startswith(("+experiment", "backend")))
    config, grid = _deployment(tmp_path, f"{overrides} rounds=2", nodes=NODES)
    session = prepare({**server_config(config), "progress": False})
    try:
        inputs = session.server.round_inputs(0, session.server.cohort(0))
        assert round_fn_for(session, grid(run_id=1), NODES, None)(inputs).shares == NODES
        resumed = round_fn_for(session, grid(run_id=2), NODES, None)
        withheld = resumed(inputs)
        assert withheld.shares == 0 and not withheld.users
        assert resumed(session.server.round_inputs(1, session.server.cohort(1))).shares == NODES
    finally:
        session.run.unlock()


@pytest.mark.parametrize("state,says", [("file", "cannot record round 1"), ("relative", "must be an absolute path")])
def test_a_node_that_cannot_remember_a_round_does_not_answer_it(tmp_path, state, says):
    """Fail closed: a secure deployed node whose state directory cannot hold the round's record (here
    a file stands where the directory would be), or whose ``state-dir`` is relative (a ClientApp
    process need not run where the SuperNode started), answers nothing."""
    config, _ = _deployment(tmp_path, "rounds=2")
    (tmp_path / "file").write_text("")
    where = str(tmp_path / "file") if state == "file" else "node-state"
    grid = LocalGrid(deployed_node.app, run_config=config, error_replies=True,
                     node_config=lambda n: {"state-dir": where})
    refused = _ask(grid, _train_message(deployment_config(config), 0, [3]))
    assert refused.has_error() and says in refused.error.reason
