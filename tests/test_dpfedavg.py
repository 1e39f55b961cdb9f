"""Privacy invariants of one DP-FedAvg round: clip bound, rejection, fixed denominator, noise
scale, sampling vs accounting, and noise-stream resume."""

import dp_accounting
import numpy as np
import pytest
import torch

from fedpriv.round.aggregation import RoundAggregate
from fedpriv.round.dpfedavg import DPFedAvg
from fedpriv.round.replies import ClientReplies, ClientUpdate
from fedpriv.mechanisms import GaussianMechanism
from fedpriv.mechanisms.base import ADD_REMOVE, REPLACE_ONE
from fedpriv.optim import ServerSGD
from fedpriv.sampling import FixedSizeSampler, PoissonSampler
from fedpriv.keys.research_key import key_from_seed, noise_from_seed


@pytest.mark.parametrize("scale", [1e-3, 0.5, 1.0, 3.0, 1e4])
def test_clip_bound_holds(scale):
    """The contribution the aggregate adds for one user has norm <= C (the path the server uses)."""
    torch.manual_seed(0)
    delta = torch.randn(1000) * scale
    agg = RoundAggregate.zeros(1000, clip_norm=1.0)
    assert agg.add(delta)
    assert float(torch.linalg.vector_norm(agg.total)) <= 1.0 * (1 + 1e-6)
    norm = float(torch.linalg.vector_norm(delta))
    assert agg.norms == [pytest.approx(norm, rel=1e-6)]
    if norm <= 1.0:
        assert torch.equal(agg.total, delta)
    else:
        torch.testing.assert_close(agg.total, delta / norm)


def test_nonfinite_and_misshaped_deltas_are_rejected_not_summed():
    agg = RoundAggregate.zeros(3, clip_norm=1.0)
    assert not agg.add(torch.tensor([1.0, float("nan"), 0.0]))
    assert not agg.add(torch.tensor([float("inf"), 0.0, 0.0]))
    assert not agg.add(torch.zeros(4))
    assert agg.add(torch.tensor([3.0, 4.0, 0.0]))
    assert agg.rejected == 3 and agg.accepted == 1 and agg.clipped == 1
    torch.testing.assert_close(agg.total, torch.tensor([0.6, 0.8, 0.0]))


def _server(sampler, sigma=0.0, clip=1.0, dim=4):
    return DPFedAvg(torch.zeros(dim), sampler, GaussianMechanism(sigma, clip, noise=noise_from_seed(0)), clip,
                    ServerSGD(lr=1.0))


def test_round_divides_by_expected_cohort_not_realised_count():
    sampler = PoissonSampler(population=100, rate=0.1, key=key_from_seed(0))  # expected cohort 10
    server = _server(sampler)
    cohort = np.array([3, 5])
    updates = [ClientUpdate(3, torch.ones(4) * 0.1), ClientUpdate(5, torch.ones(4) * 0.1)]
    _, stats = server.apply_round(0, cohort, ClientReplies(updates), diagnostics=True)
    torch.testing.assert_close(server.params, torch.full((4,), 0.2 / 10))
    assert stats["accepted"] == 2 and stats["dropped"] == 0


def test_round_rejects_outsiders_duplicates_and_counts_dropped():
    server = _server(FixedSizeSampler(population=10, cohort=3, key=key_from_seed(0)))
    cohort = np.array([1, 2, 3])
    updates = [ClientUpdate(1, torch.ones(4)), ClientUpdate(1, torch.ones(4)), ClientUpdate(9, torch.ones(4)),
               ClientUpdate(2, None)]
    released, stats = server.apply_round(0, cohort, ClientReplies(updates), diagnostics=True)
    assert released == {} and server.apply_round(1, cohort, ClientReplies(updates)) == ({}, {})  # nothing unless asked
    assert stats["accepted"] == 1 and stats["rejected"] == 3 and stats["dropped"] == 1  # user 3 never replied
    torch.testing.assert_close(server.params, torch.full((4,), 2 * 0.5 / 3))  # one clipped delta (norm 1) / 3, twice


def test_noise_std_is_sigma_times_clip():
    mech = GaussianMechanism(noise_multiplier=1.3, clip_norm=0.7, noise=noise_from_seed(1))
    z = mech.noise(0, (400_000,))
    want = 1.3 * 0.7
    # the sample std of n normals has relative standard error ~ 1/sqrt(2n) = 0.0011
    assert float(z.std()) == pytest.approx(want, rel=0.006)
    assert abs(float(z.mean())) < 5 * want / np.sqrt(z.numel())


def test_zero_noise_multiplier_adds_nothing_and_is_non_private():
    mech = GaussianMechanism(0.0, 1.0)
    assert torch.count_nonzero(mech.noise(0, (10,))) == 0
    assert isinstance(mech.round_event(PoissonSampler(10, 0.5, key_from_seed(0))), dp_accounting.NonPrivateDpEvent)


def test_noise_stream_resumes_from_state_dict():
    a = GaussianMechanism(1.0, 1.0, noise=noise_from_seed(3))
    first = [a.noise(t, (5,)) for t in range(3)]
    state = a.state_dict()
    rest = [a.noise(t, (5,)) for t in range(3, 6)]
    b = GaussianMechanism(1.0, 1.0, noise=noise_from_seed(3))  # the run key's stream, at its start
    b.load_state_dict(state)
    for want, t in zip(rest, range(3, 6)):
        torch.testing.assert_close(b.noise(t, (5,)), want)
    assert not torch.equal(first[0], rest[0])


def test_secure_rng_is_not_replayable_from_config():
    from fedpriv.keys.research_key import run_randomness

    cfg = {"seed": 0, "privacy": {"secure_rng": True}}
    a = GaussianMechanism(1.0, 1.0, noise=run_randomness(cfg).noise())
    b = GaussianMechanism(1.0, 1.0, noise=run_randomness(cfg).noise())
    assert not torch.equal(a.noise(0, (8,)), b.noise(0, (8,)))


def test_poisson_sampler_rate_and_determinism():
    s = PoissonSampler(population=2000, rate=0.05, key=key_from_seed(4))
    sizes = [len(s.sample(t)) for t in range(200)]
    assert np.mean(sizes) == pytest.approx(100, rel=0.03)
    assert np.std(sizes) == pytest.approx(np.sqrt(2000 * 0.05 * 0.95), rel=0.2)  # binomial, not fixed
    np.testing.assert_array_equal(s.sample(7), PoissonSampler(2000, 0.05, key_from_seed(4)).sample(7))
    # each user's inclusion frequency matches q
    hits = np.zeros(2000)
    for t in range(400):
        hits[s.sample(t)] += 1
    assert hits.mean() / 400 == pytest.approx(0.05, rel=0.02)


def test_fixed_size_sampler_draws_exactly_m_distinct_users():
    s = FixedSizeSampler(population=50, cohort=7, key=key_from_seed(0))
    for t in range(20):
        c = s.sample(t)
        assert len(c) == 7 and len(set(c.tolist())) == 7 and c.min() >= 0 and c.max() < 50


def test_event_matches_sampler():
    mech = GaussianMechanism(1.1, 1.0)
    poisson = PoissonSampler(population=1000, rate=0.01, key=key_from_seed(0))
    ev = mech.round_event(poisson)
    assert isinstance(ev, dp_accounting.PoissonSampledDpEvent)
    assert ev.sampling_probability == 0.01 and ev.event.noise_multiplier == 1.1
    assert mech.neighboring_relation(poisson) == ADD_REMOVE
    fixed = FixedSizeSampler(population=1000, cohort=10, key=key_from_seed(0))
    ev = mech.round_event(fixed)
    assert isinstance(ev, dp_accounting.SampledWithoutReplacementDpEvent)
    assert (ev.source_dataset_size, ev.sample_size) == (1000, 10)
    assert ev.event.noise_multiplier == pytest.approx(0.55)  # replace-one: sensitivity 2C
    assert mech.neighboring_relation(fixed) == REPLACE_ONE


def test_make_sampler_fails_closed_on_bad_sizes():
    from fedpriv.errors import ConfigError
    from fedpriv.sampling import make_sampler

    with pytest.raises(ConfigError):
        make_sampler("poisson", 10, 11, key_from_seed(0))
    with pytest.raises(ConfigError):
        make_sampler("fixed", 0, 1, key_from_seed(0))
    with pytest.raises(ConfigError):
        make_sampler("shuffle", 10, 2, key_from_seed(0))
    assert make_sampler("poisson", 10, 2, key_from_seed(0)).rate == 0.2


def test_ema_of_iterates_is_released_when_enabled_and_checkpointed():
    sampler = FixedSizeSampler(population=4, cohort=1, key=key_from_seed(0))
    server = DPFedAvg(torch.zeros(2), sampler, GaussianMechanism(0.0, 10.0), 10.0, ServerSGD(lr=1.0), ema_decay=0.5)
    for r in range(2):
        cohort = server.cohort(r)
        server.apply_round(r, cohort, ClientReplies([ClientUpdate(int(cohort[0]), torch.ones(2))]))
    torch.testing.assert_close(server.params, torch.full((2,), 2.0))
    torch.testing.assert_close(server.model_params, torch.full((2,), 0.5 * (0.5 * 1.0) + 0.5 * 2.0))
    clone = DPFedAvg(torch.zeros(2), sampler, GaussianMechanism(0.0, 10.0), 10.0, ServerSGD(lr=1.0), ema_decay=0.5)
    clone.load_state_dict(server.state_dict())
    torch.testing.assert_close(clone.model_params, server.model_params)
    plain = DPFedAvg(torch.zeros(2), sampler, GaussianMechanism(0.0, 10.0), 10.0, ServerSGD(lr=1.0))
    assert plain.model_params is plain.params


def test_cosine_schedule_decays_server_rate_and_resumes():
    from fedpriv.optim import build_server_optimizer

    opt = build_server_optimizer("sgd", rounds=4, lr=1.0, schedule="cosine")
    params = torch.zeros(1)
    steps = []
    for _ in range(4):
        new = opt.step(params, torch.ones(1))
        steps.append(float(new - params))
        params = new
    assert steps == pytest.approx([1.0, 0.5 * (1 + np.cos(np.pi / 4)), 0.5, 0.5 * (1 + np.cos(3 * np.pi / 4))])
    again = build_server_optimizer("sgd", rounds=4, lr=1.0, schedule="cosine")
    again.load_state_dict({"buffer": None, "t": 2})
    assert float(again.step(torch.zeros(1), torch.ones(1))) == pytest.approx(0.5)
    from fedpriv.errors import ConfigError

    with pytest.raises(ConfigError):
        build_server_optimizer("sgd", rounds=4, schedule="linear")
