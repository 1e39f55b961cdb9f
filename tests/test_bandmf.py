"""DP-BandMF: strategy optimization known answers, online noise = matrix form, sensitivity, state."""

import json

import dp_accounting
import pytest
import torch

from fedpriv.accounting.__main__ import main as accounting_main
from fedpriv.errors import ConfigError
from fedpriv.mechanisms import BandMFMechanism
from fedpriv.schema import load
from fedpriv.mechanisms.__main__ import main as mechanisms_main
from fedpriv.mechanisms.bandmf import (
    band_mask,
    cached_strategy,
    mean_squared_error,
    optimize_strategy,
    strategy_problem,
)
from fedpriv.sampling import CyclicPoissonSampler, CyclicSampler, PoissonSampler, make_sampler
from fedpriv.keys.research_key import key_from_seed, noise_from_seed
from tests.helpers import sensitivity_sq_brute_force


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cache"))


def test_full_band_matches_optimal_dense_value(capsys):
    assert mechanisms_main(["rmse", "--mechanism", "bandmf", "--rounds", "128", "--bands", "128", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rmse"] == pytest.approx(2.311, rel=0.01)


def test_more_bands_never_worse():
    values = [float(mean_squared_error(optimize_strategy(64, b, "general"))) ** 0.5 for b in (1, 2, 4, 8, 16, 64)]
    assert values[0] == pytest.approx((65 / 2) ** 0.5, rel=1e-6)  # b = 1: independent noise
    assert all(later <= earlier * (1 + 1e-6) for earlier, later in zip(values, values[1:])), values


def test_strategy_is_banded_lower_triangular_and_column_normalized():
    for kind in ("general", "toeplitz"):
        c = optimize_strategy(40, 6, kind, iterations=100)
        assert torch.all(c[~band_mask(40, 6)] == 0)
        norms = torch.linalg.vector_norm(c, dim=0)
        assert float(norms.max()) == pytest.approx(1.0)
    toeplitz = optimize_strategy(40, 6, "toeplitz", iterations=100)
    assert torch.allclose(torch.diagonal(toeplitz, -2), torch.diagonal(toeplitz, -2)[0].expand(38))


def test_strategy_cache_returns_the_same_matrix(tmp_path):
    first = cached_strategy(32, 4)
    files = list((tmp_path / "cache" / "bandmf").glob("*.pt"))
    assert len(files) == 1
    torch.testing.assert_close(cached_strategy(32, 4), first, rtol=0, atol=0)


def _plant(path, c):
    """A cache file as fedpriv writes it, plus a consistent checksum: a checksum proves nothing."""
    import hashlib

    torch.save({"key": path.stem, "c": c, "sha256": hashlib.sha256(c.numpy().tobytes()).hexdigest()}, path)


@pytest.mark.parametrize("damage", ["column-norm", "outside-band", "upper", "zero-diagonal", "shape", "garbage"])
def test_cached_strategy_is_revalidated_on_load(tmp_path, damage, caplog):
    """Finding 9: a cache entry whose band structure or column norms break the accounting's
    assumptions (sens² = k) is never used, however consistent its checksum."""
    good = cached_strategy(16, 3)
    path = next((tmp_path / "cache" / "bandmf").glob("*.pt"))
    bad = good.clone()
    if damage == "column-norm":
        bad[:, 5] *= 2.0
    elif damage == "outside-band":
        bad[9, 2] = 0.01
    elif damage == "upper":
        bad[2, 9] = 0.01
    elif damage == "zero-diagonal":
        bad[4, 4] = 0.0
    elif damage == "shape":
        bad = good[:15, :15].clone()
    if damage == "garbage":
        path.write_bytes(b"\x00" * 100)
    else:
        _plant(path, bad)
    with caplog.at_level("WARNING"):
        loaded = cached_strategy(16, 3)
    torch.testing.assert_close(loaded, good, rtol=0, atol=0)  # optimized again, deterministically
    assert "ignoring the cached BandMF strategy" in caplog.text
    assert strategy_problem(loaded, 16, 3) is None


def test_a_given_strategy_is_checked_too():
    c = optimize_strategy(8, 2, "general", iterations=50)
    c[:, 0] *= 3.0
    mech = BandMFMechanism(1.0, 1.0, rounds=8, bands=2, noise=noise_from_seed(0), strategy=c)
    with pytest.raises(ConfigError, match="norm"):
        mech.noise(0, (3,))


@pytest.mark.parametrize("bands", [1, 3, 5])
def test_online_noise_equals_inverse_strategy_times_draws(bands):
    n, d = 12, 5
    mech = BandMFMechanism(1.3, 0.7, rounds=n, bands=bands, noise=noise_from_seed(4))
    online = torch.stack([mech.noise(t, (d,)) for t in range(n)]).double()
    stream = noise_from_seed(4)  # the same stream, read in draw order
    draws = torch.stack([stream.normal((d,)) * 1.3 * 0.7 for _ in range(n)]).double()
    torch.testing.assert_close(online, mech.matrix(n) @ draws, rtol=1e-5, atol=1e-5)
    # the release C·x + Z: C times the residuals gives back the draws
    torch.testing.assert_close(mech.strategy @ online, draws, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_sensitivity_of_separated_participations_is_k(k):
    bands, n = 3, 10
    c = optimize_strategy(n, bands, "general", iterations=100)
    assert sensitivity_sq_brute_force(c, k, bands) == pytest.approx(k, rel=1e-9)
    if k > 1:  # closer than b rounds: cross terms appear and the bound k no longer holds
        assert sensitivity_sq_brute_force(c, k, 1) > k


def test_accounting_with_and_without_amplification():
    mech = BandMFMechanism(2.0, 1.0, rounds=220, bands=16)
    cyclic = CyclicSampler(population=10000, cohort=100, key=key_from_seed(0))
    assert mech.dp_event(cyclic, 220) == dp_accounting.GaussianDpEvent(2.0 / 3 ** 0.5)
    assert mech.neighboring_relation(cyclic) == dp_accounting.NeighboringRelation.REPLACE_SPECIAL
    amplified = CyclicPoissonSampler(population=10000, cohort=100, groups=16, key=key_from_seed(0))
    assert mech.dp_event(amplified, 220) == dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.16, dp_accounting.GaussianDpEvent(2.0)), 14)
    with pytest.raises(ConfigError, match="cyclic"):
        mech.dp_event(PoissonSampler(10000, 0.01, key_from_seed(0)), 220)
    with pytest.raises(ConfigError, match="at least 16 rounds apart"):
        mech.dp_event(CyclicSampler(population=1000, cohort=100, key=key_from_seed(0)), 220)
    with pytest.raises(ConfigError, match="groups"):
        mech.dp_event(CyclicPoissonSampler(population=10000, cohort=100, groups=8, key=key_from_seed(0)), 220)


def test_cyclic_poisson_sampler_draws_from_the_rounds_group():
    sampler = make_sampler("cyclic_poisson", 1000, 20, key_from_seed(1), groups=5)
    groups = {}
    for t in range(10):
        for u in sampler.sample(t):
            groups.setdefault(int(u), set()).add(t % 5)
    assert all(len(g) == 1 for g in groups.values())  # a user only ever in its group's rounds
    sizes = [len(sampler.sample(t)) for t in range(200)]
    assert abs(sum(sizes) / len(sizes) - 20) < 1.5


def test_resumed_bandmf_continues_the_same_noise():
    a = BandMFMechanism(1.0, 1.0, rounds=9, bands=3, noise=noise_from_seed(2))
    full = [a.noise(t, (3,)) for t in range(9)]
    b = BandMFMechanism(1.0, 1.0, rounds=9, bands=3, noise=noise_from_seed(2))
    head = [b.noise(t, (3,)) for t in range(4)]
    c = BandMFMechanism(1.0, 1.0, rounds=9, bands=3, noise=noise_from_seed(2))  # the run key's stream
    c.load_state_dict(b.state_dict())
    tail = [c.noise(t, (3,)) for t in range(4, 9)]
    torch.testing.assert_close(torch.stack(head + tail), torch.stack(full), rtol=0, atol=0)
    other = BandMFMechanism(1.0, 1.0, rounds=9, bands=2, noise=noise_from_seed(2))
    with pytest.raises(ValueError, match="strategy differs"):
        other.load_state_dict(b.state_dict())


def test_accounting_cli_bandmf(capsys):
    assert accounting_main(["epsilon", "--mechanism", "bandmf", "--bands", "16", "--noise-multiplier", "2",
                            "--rounds", "220", "--delta", "1e-5", "--population", "10000", "--cohort", "100",
                            "--sampling", "cyclic_poisson", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["neighboring_relation"] == "add_or_remove_one" and 0 < out["epsilon"] < 10
    with pytest.raises(SystemExit):
        accounting_main(["epsilon", "--mechanism", "bandmf", "--noise-multiplier", "2", "--rounds", "20",
                         "--delta", "1e-5"])
    assert "needs --bands" in capsys.readouterr().err


def test_build_and_simulate_bandmf(run_cli, tmp_path):
    assert isinstance(load("mechanism", {"name": "bandmf", "bands": 2}).build(1.0, 1.0, rounds=5), BandMFMechanism)
    proc = run_cli("+experiment=smoke", "mechanism=bandmf", "mechanism.bands=2", "sampling=cyclic_poisson",
                   "progress=false", f"run_dir={tmp_path / 'run'}",
                   )
    assert proc.returncode == 0, proc.stderr
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert privacy["mechanism"] == "bandmf" and privacy["sampling"]["kind"] == "cyclic_poisson"
