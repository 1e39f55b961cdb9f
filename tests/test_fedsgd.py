"""One-pass DP-FedSGD and central DP-SGD: the batched BK clipped sum equals the per-client loop."""

import math

import numpy as np
import pytest
import torch

from fedpriv.round.aggregation import clip_factor
from fedpriv.round.cohort import CohortClipper, pack_chunks
from fedpriv.models import build_model, get_flat_params
from fedpriv.round.training import LocalConfig, local_update

from helpers import client_draws
from tests.conftest import compose_cfg


VOCAB, SEQ = 50, 8


def _users(sizes, seed=0):
    rng = np.random.default_rng(seed)
    users = []
    for n in sizes:
        rows = rng.integers(1, VOCAB, size=(n, SEQ + 1))
        for row in rows:  # ragged sentences: pad the tail of some rows
            cut = int(rng.integers(2, SEQ + 2))
            row[cut:] = 0
        users.append(rows)
    return users


def _loop_sum(model, params, users, cohort, lr, clip):
    """The reference: each client takes one full-batch SGD step; the server clips each delta."""
    cfg = LocalConfig(epochs=1, batch_size=10**9, lr=lr, max_steps=1)
    total = torch.zeros_like(params)
    norms = []
    for u in cohort:
        delta, _ = local_update(model, params, users[u], cfg, client_draws(0))
        factor, norm = clip_factor(delta, clip)
        total += factor * delta
        norms.append(norm)
    return total, torch.tensor(norms)


@pytest.mark.parametrize("name,kwargs", [
    ("lstm", dict(embed_dim=8, hidden_size=12, projection_dim=8)),
    ("transformer", dict(d_model=16, num_layers=2, num_heads=2, ff_dim=32, max_len=SEQ)),
    ("lstm", dict(embed_dim=8, hidden_size=12, projection_dim=8, tie_embeddings=True)),
])
@pytest.mark.parametrize("mode", ["mixopt", "ghost", "instantiate"])
def test_one_pass_equals_per_client_loop(name, kwargs, mode):
    torch.manual_seed(0)
    model = build_model(name, VOCAB, **kwargs)
    replica = build_model(name, VOCAB, **kwargs)
    params = get_flat_params(model)
    users = _users([1, 3, 7, 2, 12, 5])
    cohort = np.array([0, 1, 2, 4, 5])
    lr = 0.7
    _, unclipped = _loop_sum(model, params, users, cohort, lr, 1e9)
    clip = float(unclipped.median())  # some users clipped, some not
    ref, ref_norms = _loop_sum(model, params, users, cohort, lr, clip)
    # max_rows=6 forces several chunks and one user (12 rows) larger than a chunk
    clipper = CohortClipper(replica, clip, lr, pad_id=0, mode=mode, max_rows=6)
    out = clipper.clipped_sum(params, cohort, lambda u: users[u])
    assert (ref_norms > clip).any() and (ref_norms < clip).any()
    torch.testing.assert_close(out.norms, ref_norms, rtol=1e-4, atol=1e-7)
    assert torch.linalg.vector_norm(out.total - ref) <= 1e-4 * torch.linalg.vector_norm(ref)
    # every unit's contribution respects the bound: the sum of n units has norm <= n C
    assert float(torch.linalg.vector_norm(out.total)) <= len(cohort) * clip * (1 + 1e-5)


def test_pack_chunks_keeps_units_whole():
    assert pack_chunks([3, 2, 4, 9, 1], max_rows=5) == [[0, 1], [2], [3], [4]]
    assert pack_chunks([], max_rows=5) == []


def _run(cfg):
    from fedpriv.runner import prepare
    from server.app import run_local

    session = prepare(cfg)
    run_local(session)  # the batched round where the algorithm has one (one_pass), else the client loop
    return session


def test_fedsgd_run_one_pass_equals_loop(tmp_path):
    common = ("+experiment=smoke", "algorithm=dp_fedsgd", "progress=false", "privacy.clip_norm=0.1")
    one = _run(compose_cfg(*common, run_dir=tmp_path / "one"))
    loop = _run(compose_cfg(*common, "algorithm.one_pass=false", run_dir=tmp_path / "loop"))
    assert not torch.equal(one.server.params, one.task.initial_params)
    torch.testing.assert_close(one.server.params, loop.server.params, rtol=1e-4, atol=1e-6)
    a = [r["median_update_norm"] for r in one.diagnostics]
    b = [r["median_update_norm"] for r in loop.diagnostics]
    np.testing.assert_allclose(a, b, rtol=1e-4)
    assert [r["accepted"] for r in one.diagnostics] == [r["accepted"] for r in loop.diagnostics]


def test_dpsgd_is_example_level(tmp_path):
    from fedpriv.accounting import compute_epsilon
    from fedpriv.runner import prepare
    import dp_accounting

    cfg = compose_cfg("+experiment=smoke", "algorithm=dpsgd", "cohort_size=16", "progress=false",
                      run_dir=tmp_path / "run")
    session = prepare(cfg)
    units = session.task.units
    total_rows = sum(len(u) for u in session.task.data.users)
    assert len(units) == total_rows and units[3].shape == (1, session.task.data.seq_len + 1)
    sampler = session.server.sampler
    assert math.isclose(sampler.rate, 16 / total_rows)
    sigma = session.server.mechanism.noise_multiplier
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(16 / total_rows, dp_accounting.GaussianDpEvent(sigma)), cfg["rounds"])
    eps = compute_epsilon(event, cfg["privacy"]["delta"], "rdp")
    assert eps <= cfg["privacy"]["target_epsilon"] + 1e-9 and eps > 0.9 * cfg["privacy"]["target_epsilon"]


def test_dpsgd_cli_reports_example_unit(run_cli, tmp_path):
    import json

    proc = run_cli("+experiment=smoke", "algorithm=dpsgd", "cohort_size=16", "progress=false", "rounds=1",
                   f"run_dir={tmp_path / 'run'}")  # one round: the unit and the budget do not need more
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["privacy_unit"] == "example" and summary["algorithm"] == "dpsgd"
    assert summary["privacy"]["epsilon"] <= 50.0


def test_dpsgd_refuses_flower_backend(run_cli, tmp_path):
    proc = run_cli("+experiment=smoke", "algorithm=dpsgd", "backend=flower", f"run_dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: algorithm=dpsgd is central")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("cohort", [[0, 1], [1, 0], [0, 1, 2], [2, 1, 0, 3]])
def test_a_unit_with_no_rows_contributes_nothing_in_every_round_path(cohort):
    """Issue 26, finding 5: in a 2-unit chunk an empty unit's renumbered group took the other
    unit's norm (under adaptive clipping that unit was counted twice); with >= 3 units it crashed.
    An empty unit's delta is 0 with norm 0 in the one-pass round, the per-client loop and the
    cohort-parallel trainer alike, and the other units' norms and sum do not move."""
    from fedpriv.round.cohort_parallel import CohortTrainer

    torch.manual_seed(0)
    kwargs = dict(embed_dim=8, hidden_size=12, projection_dim=8)
    model, replica = build_model("lstm", VOCAB, **kwargs), build_model("lstm", VOCAB, **kwargs)
    params = get_flat_params(model)
    users = _users([3, 0, 5, 2])  # user 1 has no rows
    assert len(users[1]) == 0
    clip, lr = 0.05, 0.7
    ref, ref_norms = _loop_sum(model, params, users, cohort, lr, clip)  # the loop: no step, delta 0
    assert float(ref_norms[cohort.index(1)]) == 0.0
    clipper = CohortClipper(replica, clip, lr, pad_id=0, max_rows=64)
    out = clipper.clipped_sum(params, np.array(cohort), lambda u: users[u])
    torch.testing.assert_close(out.norms, ref_norms, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(out.total, ref, rtol=1e-4, atol=1e-6)
    trainer = CohortTrainer(build_model("lstm", VOCAB, **kwargs), LocalConfig(epochs=1, batch_size=10**9, lr=lr,
                                                                                max_steps=1), pad_id=0, parallel=4)
    deltas = trainer.updates(params, [users[u] for u in cohort], [client_draws(0) for _ in cohort])
    assert float(deltas[cohort.index(1)][0].abs().max()) == 0.0
