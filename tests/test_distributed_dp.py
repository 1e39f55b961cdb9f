"""The distributed discrete Gaussian's encoding (fedpriv/mechanisms/ddgauss_codec.py): the rotation is
orthonormal and its own inverse, conditional rounding is unbiased and meets the accountant's norm
bound, the discrete Gaussian sampler has the discrete Gaussian's moments and mass, and the sum of
the clients' shares mod m decodes to the sum of their clipped updates plus noise of the planned
scale (no wrap-around at these bits), and wraps as often as planned at a small field."""

import math

import numpy as np
import pytest
import torch

from fedpriv.accounting.ddgauss import DistributedDiscreteGaussian, expected_wraps, granularity_for_bits
from fedpriv.mechanisms.ddgauss_codec import (DDGaussCodec, conditional_round, discrete_gaussian, hadamard, padded_dim,
                                    randomized_round)

KEY = bytes(range(32))


def test_hadamard_is_orthonormal_and_its_own_inverse():
    x = torch.randn(3, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = hadamard(x)
    torch.testing.assert_close(hadamard(y), x)
    torch.testing.assert_close(y.norm(dim=1), x.norm(dim=1))
    e = torch.zeros(8, dtype=torch.float64)
    e[0] = 1.0
    torch.testing.assert_close(hadamard(e), torch.full((8,), 1 / math.sqrt(8), dtype=torch.float64))
    assert padded_dim(1000) == 1024 and padded_dim(1024) == 1024
    with pytest.raises(ValueError):
        hadamard(torch.zeros(6))


def test_randomized_rounding_is_unbiased_and_conditional_rounding_meets_its_bound():
    v = torch.full((200_000,), 2.3, dtype=torch.float64)
    r = randomized_round(v, np.random.default_rng(0).random(200_000))
    assert set(r.unique().tolist()) == {2, 3} and float(r.double().mean()) == pytest.approx(2.3, abs=3e-3)
    x = torch.randn(1024, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 0.3
    bound = math.sqrt(float(x.pow(2).sum()) + 1024 / 4)  # about the rounded norm's mean: some tries fail
    rounded = conditional_round(x, bound, KEY, (0,))
    assert float(rounded.double().pow(2).sum()) <= bound ** 2
    with pytest.raises(RuntimeError, match="norm bound"):
        conditional_round(x, 0.5 * float(x.norm()), KEY, (0,))


@pytest.mark.parametrize("sigma", [0.7, 3.0, 40.0])
def test_the_discrete_gaussian_has_its_moments_and_mass(sigma):
    draws = discrete_gaussian(sigma, 200_000, KEY, (7,))
    assert draws.dtype == torch.int64 and len(draws) == 200_000
    k = np.arange(-int(12 * sigma) - 3, int(12 * sigma) + 4)
    pmf = np.exp(-k ** 2 / (2 * sigma ** 2))
    pmf /= pmf.sum()
    variance = float((pmf * k ** 2).sum())  # the discrete Gaussian's (not quite σ² for small σ)
    assert float(draws.double().mean()) == pytest.approx(0.0, abs=4 * math.sqrt(variance / 200_000))
    assert float(draws.double().var()) == pytest.approx(variance, rel=0.02)
    assert float((draws == 0).double().mean()) == pytest.approx(float(pmf[k == 0][0]), abs=0.005)
    assert not torch.equal(draws, discrete_gaussian(sigma, 200_000, KEY, (8,)))  # fresh per index


def test_the_sum_of_shares_decodes_to_the_clipped_sum_plus_the_planned_noise():
    length, clients = 1000, 20
    dim = padded_dim(length)
    mech = DistributedDiscreteGaussian(clip=1.0, granularity=2e-3, local_std=5e-3, shares=clients, dim=dim)
    codec = DDGaussCodec(mech, bits=20)
    gen = torch.Generator().manual_seed(2)
    updates = [torch.randn(length, generator=gen) * (0.01 if i % 2 else 1.0) for i in range(clients)]  # some clipped
    shares = [codec.encode(u, KEY, 3, bytes([i + 1]) * 32, i) for i, u in enumerate(updates)]
    assert all(s.min() >= 0 and s.max() < codec.modulus for s in shares)
    decoded = codec.decode(torch.stack(shares).sum(0), KEY, 3, length)
    clipped = sum(u.double() * min(1.0, 1.0 / float(u.double().norm())) for u in updates)
    error = decoded - clipped
    # the noise: Σ of n shares of σ/γ, times γ: std √n·σ; rounding adds at most γ/2 per coordinate
    noise_std = math.sqrt(clients) * mech.local_std
    assert float(error.std()) == pytest.approx(math.sqrt(noise_std ** 2 + clients * mech.granularity ** 2 / 6),
                                               rel=0.1)
    assert float(error.mean()) == pytest.approx(0.0, abs=4 * noise_std / math.sqrt(length))
    one = codec.decode(codec.encode(updates[0], KEY, 3, bytes([1]) * 32, 0), KEY, 3, length)
    alone = one - updates[0].double() / updates[0].double().norm()  # one share is already noised
    assert float(alone.std()) == pytest.approx(math.sqrt(mech.local_std ** 2 + mech.granularity ** 2 / 6), rel=0.1)


def test_the_codec_refuses_what_it_cannot_encode():
    mech = DistributedDiscreteGaussian(clip=1.0, granularity=1e-2, local_std=1e-2, shares=4, dim=16)
    with pytest.raises(ValueError, match="bits"):
        DDGaussCodec(mech, bits=1)
    with pytest.raises(ValueError, match="power of two"):
        DDGaussCodec(DistributedDiscreteGaussian(clip=1.0, granularity=1e-2, local_std=1e-2, shares=4, dim=12), 16)
    codec = DDGaussCodec(mech, bits=16)
    other = bytes(32)
    with pytest.raises(ValueError, match="does not fit"):
        codec.encode(torch.zeros(17), KEY, 0, other, 0)
    with pytest.raises(FloatingPointError):
        codec.encode(torch.tensor([float("nan")] * 4), KEY, 0, other, 0)
    with pytest.raises(ValueError, match="public rotation key"):
        codec.encode(torch.zeros(4), KEY, 0, KEY, 0)


def test_two_clients_under_one_key_draw_different_noise():
    """(round, user) index each client's streams: even under one key no two shares repeat noise."""
    mech = DistributedDiscreteGaussian(clip=1.0, granularity=1e-2, local_std=5e-2, shares=4, dim=64)
    codec = DDGaussCodec(mech, bits=16)
    zeros = torch.zeros(64)
    assert not torch.equal(codec.encode(zeros, KEY, 0, bytes(32), 0), codec.encode(zeros, KEY, 0, bytes(32), 1))


def test_the_sampler_matches_the_discrete_gaussian_mass_function():
    """σ = 3, 200,000 draws: a chi-square test against the pmf over |k| ≤ 12 (tails pooled), 26
    cells; the statistic stays below 60 (p ≈ 1e-4 at 25 degrees of freedom). The sampler's own
    proposals (a discrete Laplace of scale ⌊σ⌋ + 1, before the acceptance step) fail it by far."""
    sigma, n = 3.0, 200_000
    draws = discrete_gaussian(sigma, n, KEY, (11,)).numpy()
    k = np.arange(-60, 61)
    pmf = np.exp(-k ** 2 / (2 * sigma ** 2))
    pmf /= pmf.sum()

    def cells(values, weights=None):
        inner = [float(np.sum(weights[values == j]) if weights is not None else np.sum(values == j))
                 for j in range(-12, 13)]
        tail = float(np.sum(weights[np.abs(values) > 12]) if weights is not None else np.sum(np.abs(values) > 12))
        return np.array(inner + [tail])

    observed, expected = cells(draws), n * cells(k, pmf)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 60, chi2
    gen = np.random.default_rng(0)
    proposals = gen.geometric(1 - math.exp(-1 / 4), n) - gen.geometric(1 - math.exp(-1 / 4), n)
    assert float(((cells(proposals) - expected) ** 2 / expected).sum()) > 1000


def test_the_sampler_refuses_a_scale_float64_cannot_draw_exactly():
    """Above 2^44 the float64 draws stop being exact integers (at 2^57 nearly all would be even,
    leaking the parity of the sum's low bits): refused, as are fields over 2^44."""
    from fedpriv.accounting.ddgauss import MAX_BITS, granularity_for_bits

    with pytest.raises(ValueError, match="sigma"):
        discrete_gaussian(2.0 ** MAX_BITS, 4, KEY, (0,))
    with pytest.raises(ValueError, match="bits"):
        granularity_for_bits(1.0, 0.1, 4, 16, MAX_BITS + 1)
    mech = DistributedDiscreteGaussian(clip=1.0, granularity=1e-2, local_std=1e-2, shares=4, dim=16)
    with pytest.raises(ValueError, match="bits"):
        DDGaussCodec(mech, bits=MAX_BITS + 1)


def test_the_expected_wraps_per_round_match_a_simulation_at_a_small_field():
    """Issue 52 item 4b: at the size the field is planned for (the users bound, every update at the
    clip and aligned, every share present), each coordinate of the sum leaves the centred range with
    probability erfc(k/√2) — k the headroom — and the codec's own rounding and shares at 10 bits,
    k = 2, wrap that often (2 % of 256 coordinates x 200 rounds ≈ 2,300 wraps)."""
    clip, local_std, shares, users, dim, bits, k = 1.0, 0.3, 3, 4, 256, 10, 2.0
    gamma = granularity_for_bits(clip, local_std, shares, dim, bits, k, users=users)
    codec = DDGaussCodec(DistributedDiscreteGaussian(clip, gamma, local_std, shares, dim), bits)
    predicted = expected_wraps(clip, gamma, local_std, shares, dim, bits, users)
    assert predicted == pytest.approx(dim * math.erfc(k / math.sqrt(2)), rel=1e-9)  # h = k at the plan
    half, rounds, wraps = codec.modulus // 2, 200, 0
    gen = torch.Generator().manual_seed(3)  # the test's updates: any direction, drawn fresh each round
    for t in range(rounds):
        update = torch.randn(dim, dtype=torch.float64, generator=gen)
        update *= clip / float(update.norm())
        total = sum(codec.rounded(update, KEY, t, bytes([u + 1]) * 32, u) for u in range(users))
        total = total + sum(codec.noise_share(bytes([99 - p]) * 32, t, p) for p in range(shares))
        wraps += int(((total < -half) | (total >= half)).sum())  # what decode would get wrong by ±m
    assert wraps / rounds == pytest.approx(predicted, rel=0.08)
    assert expected_wraps(clip, gamma, local_std, shares, dim, bits, 1) < predicted  # a smaller sum: fewer
