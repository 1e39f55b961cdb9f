"""``aggregation=secagg`` (server/secagg.py, client/secagg.py): the nodes' clipped sums go through
Flower's own SecAgg+ (in process, over :class:`server.grid.LocalGrid`); the server unmasks only
their sum, equal to the clear sum up to the stated quantization; masked replies carry no user's
update; dropped nodes take their users with them; too many dropouts halt the round (noise only);
what cannot be served is refused in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

import fedpriv.round.clients as clients
from client.app import make_client_app
from conftest import compose_cfg
from fedpriv.round.aggregation import RoundAggregate
from fedpriv.errors import ConfigError
from fedpriv.plan import preflight
from fedpriv.runner import prepare, train
from server.app import round_fn_for
from server.grid import LocalGrid
from fedpriv.sums.secure_sum import party_message
from fedpriv.sums.secagg import SecAggSum, secagg_quantization

SECAGG = ("+experiment=smoke", "progress=false", "backend=flower", "aggregation=secagg")
NODES = 4


class RecordingGrid(LocalGrid):
    """A LocalGrid that keeps every reply, and loses the collect-stage replies of ``lose``."""

    def __init__(self, app, num_nodes: int, lose: tuple[int, ...] = ()) -> None:
        super().__init__(app, num_nodes)
        self.lose, self.replies = set(lose), []

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        for msg, msg_id in zip(messages, ids):
            stage = msg.content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE)
            if stage == Stage.COLLECT_MASKED_VECTORS and msg.metadata.dst_node_id in self.lose:
                self._replies.pop(msg_id)  # the node's masked vector never arrives
            elif msg_id in self._replies:
                self.replies.append((stage, self._replies[msg_id]))
        return ids


def _dealt(cohort) -> dict[int, list[int]]:
    from server.strategy import assign_users

    return assign_users(cohort, list(range(1, NODES + 1)))


def _quantization(session, inputs, cohort) -> tuple[float, float]:
    """(C′, one quantization step) of the run (its plan's): fixed from public quantities, never from the cohort."""
    del cohort, inputs
    q = session.plan.sums.quantization
    return q.node_clip, q.step


def _round(tmp_path, name: str, lose: tuple[int, ...] = (), *extra: str):
    cfg = compose_cfg(*SECAGG, "rounds=1", "cohort_size=12", f"backend.num_supernodes={NODES}", *extra,
                      run_dir=tmp_path / name)
    session = prepare(cfg)
    cohort = session.server.cohort(0)
    inputs = session.server.round_inputs(0, cohort)
    grid = RecordingGrid(make_client_app(cfg), NODES, lose)
    secure = round_fn_for(session, grid, NODES, None)(inputs)
    return session, cohort, inputs, grid, secure


def _clear_sum(session, inputs, users, clip) -> torch.Tensor:
    agg = RoundAggregate.zeros(inputs.params.numel(), clip)
    replies = clients.StreamedReplies(session.task, inputs.params, sorted(users), 0,
                                      clients.client_randomness(session.spec), False)
    replies.add_to(agg, set(users), 0)
    return agg.total


def test_the_unmasked_sum_is_the_clear_sum_up_to_the_quantization(tmp_path):
    """4 nodes: the sum SecAgg+ unmasks equals the clear sum of the users' updates clipped to C′
    within one quantization step per node and coordinate; every user of the cohort is in it; C′
    leaves room for the rounding (C′ + √d·step = C)."""
    session, cohort, inputs, grid, secure = _round(tmp_path, "s")
    users = {int(u) for u in cohort}
    clip, step = _quantization(session, inputs, cohort)
    clear = _clear_sum(session, inputs, users, clip)
    session.run.unlock()
    assert secure.users == users and secure.shares == NODES and len(users) >= 2 * NODES
    assert clip + math.sqrt(inputs.params.numel()) * step == pytest.approx(inputs.clip_norm)
    error = (secure.total - clear).double()
    assert float(error.abs().max()) <= NODES * step + 1e-6
    assert abs(float(error.mean())) < 4 * step * math.sqrt(NODES / error.numel())  # unbiased rounding


def test_masked_replies_carry_no_users_update(tmp_path):
    """What each node sends in the collect stage: no array, no per-user record, and a masked vector
    that looks uniform over the field and is uncorrelated with the node's clear sum (a clear
    quantized sum sits near the middle of [0, Q] with a tiny spread)."""
    from flwr.common import bytes_to_ndarray

    session, cohort, inputs, grid, secure = _round(tmp_path, "m")
    sent = _dealt(cohort)
    clip, _ = _quantization(session, inputs, cohort)
    collected = [reply for stage, reply in grid.replies if stage == Stage.COLLECT_MASKED_VECTORS]
    assert len(collected) == NODES
    field = 2 ** session.spec.aggregation.modulus_bits
    for reply in collected:
        content = reply.content
        assert all(len(record) == 0 for record in content.array_records.values())
        assert set(content.metric_records) == {"fitres.num_examples"}
        fitres = content.config_records["fitres.metrics"]  # what the mod leaves in the clear
        assert len(fitres) == 0 and content.metric_records["fitres.num_examples"]["num_examples"] == 1
        arrays = [bytes_to_ndarray(b) for b in content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]]
        masked = arrays[-1].astype(np.float64).reshape(-1)
        assert masked.size == inputs.params.numel()
        assert masked.std() == pytest.approx(field / math.sqrt(12), rel=0.05)  # uniform over the field
        clear = _clear_sum(session, inputs, sent[int(reply.metadata.src_node_id)], clip).double().numpy()
        assert abs(np.corrcoef(masked, clear)[0, 1]) < 0.05
    session.run.unlock()


def test_a_lost_node_takes_its_users_and_the_rest_is_summed(tmp_path):
    """One of 4 nodes loses its masked vector: SecAgg+ still unmasks the other three (threshold 3);
    the lost node's users count as dropped and the sum is the others' clear sum."""
    session, cohort, inputs, grid, secure = _round(tmp_path, "l", (2,))
    kept = {u for node, users in _dealt(cohort).items() if node != 2 for u in users}
    clip, step = _quantization(session, inputs, cohort)
    clear = _clear_sum(session, inputs, kept, clip)
    session.run.unlock()
    assert secure.users == kept and secure.shares == NODES - 1
    assert float((secure.total - clear).abs().max()) <= NODES * step + 1e-6


def test_dropouts_beyond_the_threshold_halt_the_round_and_release_noise_only(tmp_path):
    """Two of 4 nodes lost (threshold 3): the protocol halts; the round's release is the noise
    alone divided by the fixed denominator, and every user counts as dropped."""
    session, cohort, inputs, grid, secure = _round(tmp_path, "h", (1, 2))
    assert secure.users == set() and secure.shares == 0 and torch.count_nonzero(secure.total) == 0
    agg = RoundAggregate.zeros(inputs.params.numel(), inputs.clip_norm)
    seen, _ = secure.add_to(agg, {int(u) for u in cohort}, 0)
    session.run.unlock()
    assert seen == set() and agg.accepted == 0


def test_a_secure_run_ends_where_the_clear_run_ends(tmp_path):
    """The same cohorts and noise (privacy.research_key=seed): 3 rounds through SecAgg+ over
    LocalGrid release a model within the quantization of the clear run's; privacy.json is the
    same claim."""
    import json

    common = ("rounds=3", f"backend.num_supernodes={NODES}", "privacy.research_key=seed", "privacy.secure_rng=false")
    finals = {}
    for name, aggregation in (("clear", "plain"), ("secure", "secagg")):
        cfg = compose_cfg("+experiment=smoke", "progress=false", "backend=flower", f"aggregation={aggregation}",
                          *common, run_dir=tmp_path / name)
        session = prepare(cfg)
        train(session, round_fn_for(session, LocalGrid(make_client_app(cfg), NODES), NODES, None))
        finals[name] = session.server.model_params.clone()
    privacy = {n: json.loads((tmp_path / n / "privacy.json").read_text()) for n in finals}
    assert privacy["clear"]["epsilon"] == privacy["secure"]["epsilon"]
    gap = float((finals["clear"] - finals["secure"]).abs().max())
    assert 0 < gap < 1e-3, gap


@pytest.mark.parametrize("override,says", [
    ("backend=local", "backend=flower or a deployment"),
    ("backend.num_supernodes=1", "at least 2 nodes"),
    ("secagg.modulus_bits=21", "overflow the field"),
    ("secagg.threshold=2", "must exceed half"),
    ("secagg.shares=3", "must exceed half"),
    ("privacy.clipping=adaptive", "clipping=fixed"),
    ("optimizer=dpadam_stp", "only the nodes' sum"),
])
def test_what_secure_aggregation_cannot_serve_is_refused(tmp_path, override, says):
    nodes = () if override.startswith("backend") else (f"backend.num_supernodes={NODES}",)
    with pytest.raises(ConfigError, match=says):
        preflight(compose_cfg(*SECAGG, *nodes, override, run_dir=tmp_path / "x"))


@pytest.mark.slow
def test_flowers_simulation_engine_runs_the_secure_smoke_run(run_cli, tmp_path):
    """``+experiment=smoke backend=flower aggregation=secagg`` under Ray: 3 rounds, the claim kept."""
    import json

    proc = run_cli("+experiment=smoke", "backend=flower", "aggregation=secagg", f"run_dir={tmp_path / 'r'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["rounds"] == 3 and summary["privacy"]["epsilon"] <= 50.0


def test_distributed_noise_through_secagg_plus_decodes_to_the_clear_sum_plus_the_shares(tmp_path):
    """mechanism=ddgauss over SecAgg+ (4 nodes = 4 parties): each node's message in Z_m passes
    Flower's quantizer unchanged and the server decodes Σ of them mod m — the clear sum of the
    users' clipped updates plus the 4 shares (std √4·σ) and the rounding; the node planned its
    own σ from the config (the same as the server's)."""
    session, cohort, inputs, grid, secure = _round(tmp_path, "d", (), "mechanism=ddgauss", "mechanism.shares=4",
                                                   "privacy.noise_multiplier=0.5")
    mech = session.server.mechanism
    users = {int(u) for u in cohort}
    clear = _clear_sum(session, inputs, users, inputs.clip_norm)
    session.run.unlock()
    dist = mech.distribution()
    assert secure.users == users and secure.shares == NODES
    error = (secure.total - clear).double()
    std = math.sqrt(NODES * dist.local_std ** 2 + len(users) * dist.granularity ** 2 / 6)
    assert float(error.std()) == pytest.approx(std, rel=0.05)
    assert abs(float(error.mean())) < 4 * std / math.sqrt(error.numel())


def test_distributed_noise_over_secagg_plus_takes_every_node_as_a_party(tmp_path):
    """mechanism=ddgauss aggregation=secagg without mechanism.shares: the parties are the nodes
    (config.yaml names them; every share guaranteed, so SecAgg+'s threshold is all of them), and a
    round's sum holds a share from each; in process the default stays 8 parties. An explicit other
    count is refused (below)."""
    from fedpriv.config.resolve import resolve_config

    cfg = compose_cfg(*SECAGG, f"backend.num_supernodes={NODES}", "mechanism=ddgauss", run_dir=tmp_path / "p")
    plan = preflight(cfg)
    assert resolve_config(cfg)["mechanism"]["shares"] == NODES and plan.spec.mechanism.shares == NODES
    assert (plan.ledger.mechanism.shares, plan.ledger.mechanism.min_shares, plan.sums.shares,
            plan.sums.threshold) == (NODES, NODES, NODES, NODES)
    session, cohort, inputs, grid, secure = _round(tmp_path, "d", (), "mechanism=ddgauss",
                                                   "privacy.noise_multiplier=0.5")
    session.run.unlock()
    assert secure.shares == NODES and secure.users == {int(u) for u in cohort}
    local = preflight(compose_cfg("+experiment=smoke", "mechanism=ddgauss", run_dir=tmp_path / "l"))
    assert local.spec.mechanism.shares is None and local.ledger.mechanism.shares == 8


@pytest.mark.parametrize("override,says", [("mechanism.shares=3", "num_supernodes=4"),
                                           ("mechanism.bits=31", "int32"),
                                           ("aggregation=plain", "needs aggregation=secagg")])
def test_distributed_noise_over_flower_is_refused_where_it_cannot_hold(tmp_path, override, says):
    with pytest.raises(ConfigError, match=says):
        preflight(compose_cfg(*SECAGG, f"backend.num_supernodes={NODES}", "mechanism=ddgauss", "mechanism.shares=4",
                              override, run_dir=tmp_path / "x"))


def test_the_grid_is_fixed_for_the_run_whatever_the_cohort():
    """c and C′ come from public quantities (clip, dimension, expected cohort, nodes): one user more
    or less in a round changes neither (their values are sent to every node)."""
    q = secagg_quantization(SecAggSum(), 0.5, 16832, 8.0, 4)
    assert q == secagg_quantization(SecAggSum(), 0.5, 16832, 8.0, 4)
    assert q.node_clip + math.sqrt(16832) * q.step == pytest.approx(0.5)
    assert q.coordinate_range == pytest.approx(0.5 * math.ceil(2 + 4 * math.sqrt(2)))  # C·(m̄/n + 4√(m̄/n))
    with pytest.raises(ValueError, match="overflow"):
        secagg_quantization(SecAggSum(bits=20, modulus_bits=21), 0.5, 100, 8.0, 4)
    with pytest.raises(ValueError, match="too coarse"):
        secagg_quantization(SecAggSum(bits=8), 0.5, 10 ** 6, 8.0, 4)


def test_distributed_noise_survives_a_lost_party_exactly(tmp_path):
    """ddgauss over SecAgg+ with one of 4 nodes lost (min_shares 3): the field sum the server recovers from
    Flower's output is exactly Σ of the 3 surviving parties' messages mod m (unmasked_field_sum
    inverts Flower's weighting for 3 survivors), and the sum holds 3 shares."""
    session, cohort, inputs, grid, secure = _round(tmp_path, "x", (3,), "mechanism=ddgauss", "mechanism.shares=4",
                                                   "mechanism.min_shares=3", "privacy.noise_multiplier=0.5")
    codec = session.server.mechanism.codec()
    rng = clients.client_randomness(session.spec)
    round_key = session.randomness.subkey("ddgauss rotation")
    dealt = _dealt(cohort)
    expected = torch.zeros(codec.mechanism.dim, dtype=torch.int64)
    for party, (node, users) in enumerate(dealt.items()):
        if node != 3:
            expected += party_message(codec, session.task, inputs.params, users, 0, round_key, rng, party).message
    expected = torch.remainder(expected, codec.modulus)
    decoded = codec.decode(expected, round_key, 0, inputs.params.numel()).to(torch.float32)
    session.run.unlock()
    assert secure.shares == NODES - 1 and secure.users == {u for n, us in dealt.items() if n != 3 for u in us}
    assert torch.equal(secure.total, decoded)


def test_rounds_that_halt_in_a_row_stop_the_run(tmp_path):
    """Three halted rounds in a row (two of four nodes lost each round): an error, not a run that
    spends its whole budget on noise."""
    cfg = compose_cfg(*SECAGG, "rounds=3", "cohort_size=12", f"backend.num_supernodes={NODES}", run_dir=tmp_path / "h")
    session = prepare(cfg)
    round_fn = round_fn_for(session, RecordingGrid(make_client_app(cfg), NODES, (1, 2)), NODES, None)
    try:
        for r in range(2):
            assert round_fn(session.server.round_inputs(r, session.server.cohort(0))).shares == 0
        with pytest.raises(RuntimeError, match="halted 3 rounds in a row"):
            round_fn(session.server.round_inputs(2, session.server.cohort(0)))
    finally:
        session.run.unlock()


def test_a_research_secure_round_is_reproducible(tmp_path):
    """Research mode: Flower's stochastic rounding is seeded from the research key per (round,
    party), so the same round gives the same unmasked sum (outputs say the run is reproducible)."""
    totals = []
    for name in ("a", "b"):
        session, cohort, inputs, grid, secure = _round(tmp_path, name)
        session.run.unlock()
        totals.append(secure.total)
    assert torch.equal(totals[0], totals[1])


def test_a_sum_with_fewer_shares_than_assumed_is_never_unmasked(tmp_path):
    """ddgauss with every share guaranteed (min_shares = 4 = the nodes) and one node lost: SecAgg+'s
    threshold is raised to min_shares, so the protocol halts before unmasking — the server never
    sees a sum with less noise than the accounting assumes."""
    session, cohort, inputs, grid, secure = _round(tmp_path, "t", (3,), "mechanism=ddgauss", "mechanism.shares=4",
                                                   "privacy.noise_multiplier=0.5")
    session.run.unlock()
    assert secure.shares == 0 and secure.users == set()
    assert not any(stage == Stage.UNMASK for stage, _ in grid.replies)


@pytest.mark.parametrize("server,node,says", [
    (("mechanism=ddgauss", "mechanism.shares=4", "privacy.noise_multiplier=0.5"),
     ("mechanism=ddgauss", "mechanism.shares=4", "privacy.noise_multiplier=0.6"), "differs"),
    ((), ("mechanism=ddgauss", "mechanism.shares=4", "privacy.noise_multiplier=0.5"), "SecAgg\\+ settings differ"),
    ((), ("secagg.bits=22",), "SecAgg\\+ settings differ"),
])
def test_a_node_refuses_a_server_whose_round_differs_from_its_own_plan(tmp_path, server, node, says):
    """A node follows its own plan of the run's config: a server that asks for less noise, for
    another field or quantization, or for a clear sum where the node's mechanism adds noise, is
    refused (the node fails; over a real grid its users count as dropped)."""
    cfg = compose_cfg(*SECAGG, "rounds=1", "cohort_size=12", f"backend.num_supernodes={NODES}", *server,
                      run_dir=tmp_path / "s")
    node_cfg = compose_cfg(*SECAGG, "rounds=1", "cohort_size=12", f"backend.num_supernodes={NODES}", *node,
                           run_dir=tmp_path / "n")
    session = prepare(cfg)
    grid = LocalGrid(make_client_app(node_cfg), NODES)
    try:
        with pytest.raises(RuntimeError, match=says):
            round_fn_for(session, grid, NODES, None)(session.server.round_inputs(0, session.server.cohort(0)))
    finally:
        session.run.unlock()
