"""``mechanism=ddgauss`` as a run option (fedpriv/mechanisms/ddgauss.py, fedpriv/sums/secure_sum.py): the
parties add the noise, a simulated secure sum reveals only the total, the ledger charges the
distributed discrete Gaussian's own event, a round below the guaranteed shares is withheld, and
every configuration it cannot serve is one ``error:`` line."""

from __future__ import annotations

import json
import math

import pytest
import torch

import fedpriv.round.clients as clients
from conftest import compose_cfg
from fedpriv.accounting.accountant import RDP, compute_epsilon
from fedpriv.round.aggregation import RoundAggregate
from fedpriv.errors import ConfigError
from fedpriv.mechanisms.base import ADD_REMOVE, ZERO_OUT
from fedpriv.plan import preflight
from fedpriv.keys.randomness import ClientRandomness
from fedpriv.round.replies import ClientReplies, ClientUpdate
from fedpriv.runner import prepare
from fedpriv.sampling import make_sampler
from fedpriv.sums.secure_sum import SecureSum, assign_parties, distributed_round_fn
from fedpriv.schema import load

SMOKE = ("+experiment=smoke", "progress=false", "mechanism=ddgauss")


def _session(tmp_path, name: str, *extra: str):
    cfg = compose_cfg(*SMOKE, "rounds=1", "cohort_size=8", *extra, run_dir=tmp_path / name)
    return cfg, prepare(cfg)


def test_the_secure_sum_is_the_clipped_sum_plus_the_parties_noise(tmp_path):
    """One round, the same cohort and draws: the decoded secure sum minus the clear clipped sum
    (backend=local's plain round) is the parties' noise and the rounding — mean ≈ 0, std ≈
    √(shares·σ² + users·γ²/6) — and the server learns the users it holds, not one update."""
    cfg, session = _session(tmp_path, "s", "privacy.noise_multiplier=0.5", "mechanism.shares=5")
    mech = session.server.mechanism
    cohort = session.server.cohort(0)
    inputs = session.server.round_inputs(0, cohort)
    expected = {int(u) for u in cohort}
    secure = distributed_round_fn(session.task, session.spec, mech, b"r" * 32)(inputs)
    plain = RoundAggregate.zeros(inputs.params.numel(), inputs.clip_norm)
    clients.in_process_round_fn(session.task, session.spec)(inputs).add_to(plain, expected, 0)
    agg = RoundAggregate.zeros(inputs.params.numel(), inputs.clip_norm)
    seen, _ = secure.add_to(agg, expected, 0)
    session.run.unlock()
    assert seen == expected and agg.accepted == len(expected) and agg.shares == 5 and agg.norms == []
    assert set(agg.stats()) == {"accepted", "rejected", "shares"}  # no norm, no clipped count: never seen
    dist = mech.distribution()
    error = (agg.total - plain.total).double()
    std = math.sqrt(5 * dist.local_std ** 2 + len(expected) * dist.granularity ** 2 / 6)
    assert float(error.std()) == pytest.approx(std, rel=0.05)
    assert abs(float(error.mean())) < 4 * std / math.sqrt(error.numel())
    assert dist.local_std == pytest.approx(0.5 * session.spec.privacy.clip_norm / math.sqrt(5))


def test_a_run_names_its_mechanism_and_charges_its_event(tmp_path):
    """privacy.json names ddgauss, its field, grid and shares; ε is the event's own (RDP); the
    ledger's event is the distributed discrete Gaussian's, not a Gaussian's."""
    from server.app import run_local

    run_local(prepare(compose_cfg(*SMOKE, "mechanism.shares=4", "mechanism.min_shares=3", run_dir=tmp_path / "run")))
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert privacy["mechanism"] == "ddgauss" and privacy["bits"] == 20 and privacy["field_size"] == 2 ** 20
    assert privacy["shares"] == 4 and privacy["min_shares"] == 3
    # at the planned size a coordinate wraps with probability erfc(k/√2), k the headroom (item 4b)
    wraps = privacy["padded_dim"] * math.erfc(privacy["headroom_std"] / math.sqrt(2))
    assert privacy["expected_wraps_per_round"] == pytest.approx(wraps, rel=1e-9)
    assert privacy["events"][0].startswith("DistributedDiscreteGaussian(") and "shares=3" in privacy["events"][0]
    session_cfg = compose_cfg(*SMOKE, "mechanism.shares=4", "mechanism.min_shares=3", run_dir=tmp_path / "p")
    plan = preflight(session_cfg)
    event = plan.ledger.mechanism.dp_event(plan.ledger.sampler, 3)
    assert privacy["epsilon"] == pytest.approx(compute_epsilon(event, privacy["delta"], RDP, ZERO_OUT))
    assert privacy["epsilon"] <= 50.0
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 3 and all("withheld" not in row for row in metrics)


def test_epsilon_falls_as_the_noise_multiplier_grows():
    """Calibration assumes ε(σ) non-increasing: γ grows with σ, but σ/γ grows too (docstring)."""
    option = load("mechanism", {"name": "ddgauss", "bits": 16, "shares": 10})
    sampler = make_sampler("poisson", 1000, 20, None, public_population=1000)
    mech = option.build(1.0, 1.0, rounds=50, sampler=sampler, dimension=5000)
    eps = [compute_epsilon(mech.dp_event(sampler, 50, noise_multiplier=z), 1e-5, RDP, ADD_REMOVE)
           for z in (0.3, 0.5, 0.8, 1.2, 2.0, 4.0)]
    assert all(a > b for a, b in zip(eps, eps[1:])), eps


def test_a_round_below_the_guaranteed_shares_is_withheld(tmp_path):
    """Fewer surviving shares than min_shares: nothing is released, the model does not move, the
    round is still charged; at min_shares it is released."""
    cfg, session = _session(tmp_path, "w", "mechanism.shares=4", "mechanism.min_shares=3")
    server = session.server
    cohort = server.cohort(0)
    before = server.params.clone()
    dim = before.numel()
    total = torch.full((dim,), 0.25)
    users = {int(u) for u in cohort}
    released, _ = server.apply_round(0, cohort, SecureSum(total, users, shares=2), diagnostics=False)
    assert released == {"withheld": 1.0} and torch.equal(server.params, before)
    released, _ = server.apply_round(1, cohort, SecureSum(total, users, shares=3), diagnostics=False)
    session.run.unlock()
    assert "withheld" not in released and not torch.equal(server.params, before)


def test_clear_updates_never_reach_a_distributed_mechanism(tmp_path):
    """Fail closed: a sum of clear updates (no parties' noise in it) under ddgauss is an error."""
    cfg, session = _session(tmp_path, "c")
    server = session.server
    cohort = server.cohort(0)
    replies = ClientReplies([ClientUpdate(int(u), torch.zeros_like(server.params)) for u in cohort])
    with pytest.raises(RuntimeError, match="clear updates"):
        server.apply_round(0, cohort, replies)
    session.run.unlock()


def test_parties_are_dealt_users_in_turn_and_keys_are_secret_in_secure_mode():
    assert assign_parties([9, 3, 5, 7, 1], 3) == [[3, 9], [1, 7], [5]]
    assert assign_parties([2], 3) == [[], [], [2]]
    # a user's party is its own: removing user 5 moves nobody else (the add/remove pair under dropouts)
    with_u, without_u = assign_parties([3, 5, 7, 9, 11], 2), assign_parties([3, 7, 9, 11], 2)
    assert [sorted(set(p) - {5}) for p in with_u] == without_u
    research = ClientRandomness(b"k" * 32)
    assert research.party_key(0, 1) == research.party_key(0, 1) != research.party_key(0, 2)
    assert research.party_key(0, 1) != research.draws(0, 1).key  # its own label
    secure = ClientRandomness(None)
    assert secure.party_key(0, 1) != secure.party_key(0, 1)  # fresh OS entropy each time


@pytest.mark.parametrize("override,says", [
    ("backend=flower", "needs aggregation=secagg"),
    ("algorithm=dp_fedsgd", "algorithm=dp_fedavg"),
    ("privacy.clipping=adaptive", "clipping=fixed"),
    ("audit.canaries=4", "audit.canaries=0"),
    ("privacy.accountant=pld", "RDP only"),
    ("sampling=fixed", "Poisson sampling only"),
    ("optimizer=dpadam_stp", "secure sum"),
    ("optimizer=dpadam_ime", "independent Gaussian noise"),
    ("mechanism.bits=4", "bits=4"),
    ("mechanism.min_shares=9", "min_shares"),
    ("privacy.noise_multiplier=0", "needs noise"),
])
def test_what_ddgauss_cannot_serve_is_refused(tmp_path, override, says):
    cfg = compose_cfg(*SMOKE, override, run_dir=tmp_path / "x")
    with pytest.raises(ConfigError, match=says):
        preflight(cfg)


def test_dropped_parties_take_their_users_and_their_share_with_them(tmp_path):
    """client.dropout_rate: a party that fails sends nothing — its users count as dropped and the
    sum holds one share fewer; the draws are the run's (keyed), never the data's."""
    cfg, session = _session(tmp_path, "d", "mechanism.shares=6", "client.dropout_rate=0.5")
    mech = session.server.mechanism
    cohort = session.server.cohort(0)
    inputs = session.server.round_inputs(0, cohort)
    key = b"d" * 32
    secure = distributed_round_fn(session.task, session.spec, mech, b"r" * 32, key)(inputs)
    session.run.unlock()
    lost = clients.dropped(key, 0, range(6), 0.5, "party")
    parties = assign_parties([int(u) for u in cohort], 6)
    assert 0 < lost.sum() < 6 and secure.shares == 6 - int(lost.sum())
    assert secure.users == {u for p, members in enumerate(parties) if not lost[p] for u in members}
    assert not clients.dropped(None, 0, range(6), 0.0).any()
    # one participant's draw does not depend on who else takes part
    assert clients.dropped(key, 0, [4, 9], 0.5)[1] == clients.dropped(key, 0, [9], 0.5)[0]


def test_dropouts_withhold_rounds_and_keep_the_claim(tmp_path):
    """A run whose parties drop (rate 0.4, 4 of 6 shares guaranteed): rounds with fewer than 4
    survivors are withheld, and ε is the same as without dropouts (the guaranteed shares fix it)."""
    from server.app import run_local

    common = (*SMOKE, "rounds=6", "mechanism.shares=6", "mechanism.min_shares=4")
    run_local(prepare(compose_cfg(*common, "client.dropout_rate=0.4", run_dir=tmp_path / "drop")))
    run_local(prepare(compose_cfg(*common, run_dir=tmp_path / "full")))
    rows = [json.loads(line) for line in (tmp_path / "drop" / "diagnostics.jsonl").read_text().splitlines()]
    withheld = [row for row in rows if row.get("withheld")]
    assert withheld and all(row["shares"] < 4 for row in withheld)
    assert all(row["shares"] >= 4 for row in rows if not row.get("withheld"))
    eps = [json.loads((tmp_path / name / "privacy.json").read_text())["epsilon"] for name in ("drop", "full")]
    assert eps[0] == eps[1]


def test_plain_rounds_drop_users_at_the_dropout_rate(tmp_path):
    """Without a distributed mechanism each sampled user fails with the rate: the diagnostics count
    them as dropped; the denominator is fixed, so ε does not move."""
    from server.app import run_local

    run_local(prepare(compose_cfg("+experiment=smoke", "progress=false", "client.dropout_rate=0.5",
                                  run_dir=tmp_path / "p")))
    rows = [json.loads(line) for line in (tmp_path / "p" / "diagnostics.jsonl").read_text().splitlines()]
    assert sum(row["dropped"] for row in rows) > 0
    assert all(row["accepted"] + row["dropped"] == row["cohort_size"] for row in rows)


@pytest.mark.parametrize("override,says", [("backend=flower", "backend=local"), ("algorithm=dp_fedsgd", "one pass"),
                                           ("client.dropout_rate=1.0", "dropout_rate")])
def test_simulated_dropouts_are_refused_where_they_mean_nothing(tmp_path, override, says):
    rate = () if override.startswith("client.dropout_rate") else ("client.dropout_rate=0.2",)
    with pytest.raises(ConfigError, match=says):
        preflight(compose_cfg("+experiment=smoke", *rate, override, run_dir=tmp_path / "x"))


def test_the_parties_encode_with_the_accounted_mechanism(tmp_path):
    """shares=4, min_shares=3: the codec's mechanism (what the parties add) is the event's (what
    the ledger charges) at clip C — share std σC/√3, the same grid step, padded dimension and β —
    and its relation is add/remove only because its parties are fixed."""
    cfg, session = _session(tmp_path, "e", "mechanism.shares=4", "mechanism.min_shares=3", "population=40")
    mech, sampler = session.server.mechanism, session.server.sampler
    session.run.unlock()
    codec = mech.codec().mechanism
    event = mech.dp_event(sampler, 3)
    charged = event.mechanism()  # at clip 1
    clip = session.spec.privacy.clip_norm
    assert event.fixed_parties and event.shares == 3 and event.sampling_rate == sampler.rate
    assert codec.local_std == pytest.approx(charged.local_std * clip, rel=1e-12)
    assert codec.local_std == pytest.approx(mech.noise_multiplier * clip / math.sqrt(3), rel=1e-12)
    assert codec.granularity == pytest.approx(charged.granularity * clip, rel=1e-12)
    assert (codec.dim, codec.beta, codec.shares) == (charged.dim, charged.beta, charged.shares)
    assert mech.neighboring_relation(sampler) == ADD_REMOVE  # a public population


@pytest.mark.parametrize("override,says", [("mechanism.bits=45", "bits"), ("plan=auto", "plan=fixed")])
def test_a_field_wider_than_float64_sampling_and_planning_are_refused(tmp_path, override, says):
    extra = ("population=40",) if override == "plan=auto" else ()
    with pytest.raises(ConfigError, match=says):
        preflight(compose_cfg(*SMOKE, *extra, override, run_dir=tmp_path / "x"))
