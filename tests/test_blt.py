"""BLT strategies (fedpriv/mechanisms/blt.py): the online generator equals the explicit C⁻¹Z,
the closed-form min-separation sensitivity equals brute force, the error equals the explicit
prefix-sum error, and the optimiser beats the tree and independent noise."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import ROOT
from helpers import sensitivity_sq_brute_force

from fedpriv.mechanisms.analysis import prefix_rmse
from fedpriv.mechanisms.blt import BLTParams, error, inverse_noise, optimize, rmse, sensitivity_sq
from tests.warm_launcher import run_module


def _params(seed: int, buffers: int = 3) -> BLTParams:
    g = torch.Generator().manual_seed(seed)
    return BLTParams(torch.rand(buffers, generator=g, dtype=torch.float64) * 0.5 + 0.01,
                     torch.rand(buffers, generator=g, dtype=torch.float64) * 0.98 + 0.01)


@pytest.mark.parametrize("seed", range(3))
def test_online_noise_equals_explicit_inverse(seed):
    params, n = _params(seed), 40
    draws = torch.randn(n, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    explicit = torch.linalg.solve_triangular(params.matrix(n), draws, upper=False)
    torch.testing.assert_close(inverse_noise(params, draws), explicit, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("seed,k,s", [(0, 1, 0), (1, 2, 3), (2, 3, 2), (3, 4, 1), (4, 2, 0)])
def test_min_separation_sensitivity_equals_brute_force(seed, k, s):
    params, n = _params(seed), 11
    closed = float(sensitivity_sq(params.coefficients(n), k, s))
    assert closed == pytest.approx(sensitivity_sq_brute_force(params.matrix(n), k, s + 1), rel=1e-12)


def test_error_equals_the_explicit_prefix_error():
    params, n = _params(7), 50
    c = params.matrix(n)
    explicit = prefix_rmse(torch.linalg.inv(c), float(torch.linalg.vector_norm(c, dim=0).max() ** 2))
    assert rmse(params, n) == pytest.approx(explicit, rel=1e-9)
    assert float(error(params.coefficients(n), kind="max")) >= float(error(params.coefficients(n)))


def test_optimised_blt_beats_the_tree_and_independent_noise():
    from fedpriv.mechanisms.__main__ import rmse as mechanism_rmse

    n = 128
    params, report = optimize(n, 3)
    assert params.buffers == 3 and report["rmse"] == pytest.approx(rmse(params, n))
    assert report["rmse"] < mechanism_rmse("tree-efficient", n) < mechanism_rmse("gaussian", n)
    two, _ = optimize(n, 2, participations=2, separation=40)
    assert rmse(two, n, 2, 40) < rmse(params, n, 2, 40) + 1e-9  # optimised for the pattern it is scored on


def test_rmse_cli_for_blt_and_its_errors(capsys):
    def cli(*args):
        return run_module("fedpriv.mechanisms", "rmse", *args, cwd=ROOT)

    res = cli("--mechanism", "blt", "--rounds", "64", "--buffers", "2", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["buffers"] == 2 and math.isfinite(out["rmse"])
    params = BLTParams(torch.tensor(out["weights"], dtype=torch.float64),
                       torch.tensor(out["decays"], dtype=torch.float64))
    assert rmse(params, 64) == pytest.approx(out["rmse"], rel=1e-9)
    from fedpriv.mechanisms.__main__ import main

    for bad in (["--mechanism", "blt", "--rounds", "64", "--buffers", "9"],
                ["--mechanism", "blt", "--rounds", "64", "--participations", "2"],
                ["--mechanism", "tree", "--rounds", "64", "--participations", "2", "--min-separation", "3"],
                ["--mechanism", "bandmf", "--rounds", "64", "--bands", "8", "--participations", "2",
                 "--min-separation", "3"]):
        with pytest.raises(SystemExit) as exit_:
            main(["rmse", *bad])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith("error:") and len(err.splitlines()) == 1, err


# --- the mechanism (mechanism=blt) ------------------------------------------------------------------

def _mechanism(rounds=6, buffers=2, sigma=1.0, seed=0):
    from fedpriv.mechanisms.blt import BLTMechanism
    from fedpriv.keys.randomness import NoiseStream
    from fedpriv.keys.research_key import key_from_seed

    return BLTMechanism(sigma, 1.0, rounds=rounds, buffers=buffers, noise=NoiseStream(key_from_seed(seed)))


def test_mechanism_noise_equals_its_explicit_matrix_and_resumes_by_replaying_its_buffers():
    mech = _mechanism()
    torch.testing.assert_close(mech.matrix(6), torch.linalg.inv(mech.params.matrix(6)), rtol=1e-10, atol=1e-12)
    full = [mech.noise(t, (5,)) for t in range(6)]
    first = _mechanism()
    head = [first.noise(t, (5,)) for t in range(3)]
    resumed = _mechanism()
    resumed.load_state_dict(first.state_dict())
    tail = [resumed.noise(t, (5,)) for t in range(3, 6)]
    for a, b in zip(full, head + tail):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    tensors = [v for v in first.state_dict().values() if isinstance(v, torch.Tensor)]
    assert sum(t.numel() for t in tensors) == 2 * 2  # weights and decays only: the buffers are replayed, not stored


def test_mechanism_is_accounted_with_cyclic_sampling_only():
    from fedpriv.errors import ConfigError
    from fedpriv.sampling import make_sampler

    mech = _mechanism(rounds=12, buffers=2, sigma=2.0)
    cyclic = make_sampler("cyclic", 40, 10, None)  # 4 blocks: 3 participations, 3 rounds strictly between
    event = mech.dp_event(cyclic, 12)
    sens_sq = float(sensitivity_sq(mech.params.coefficients(12), 3, 3))
    assert event.noise_multiplier == pytest.approx(2.0 / math.sqrt(sens_sq), rel=1e-12)
    assert mech.accounting_details(cyclic, 12)["blt_sensitivity_sq"] == pytest.approx(sens_sq)
    # a prefix is accounted with its own participations and coefficients
    assert mech.dp_event(cyclic, 4).noise_multiplier == pytest.approx(
        2.0 / math.sqrt(float(sensitivity_sq(mech.params.coefficients(4), 1, 3))), rel=1e-12)
    for kind in ("poisson", "fixed"):
        with pytest.raises(ConfigError, match="sampling=cyclic"):
            mech.dp_event(make_sampler(kind, 40, 10, None), 12)


def test_smoke_run_with_blt(tmp_path):
    from fedpriv.runner import prepare
    from server.app import run_local
    from conftest import compose_cfg

    summary = run_local(prepare(compose_cfg("+experiment=smoke", "mechanism=blt", "mechanism.buffers=2",
                                            "progress=false", run_dir=tmp_path / "r")))
    privacy = json.loads((tmp_path / "r" / "privacy.json").read_text())
    assert privacy["mechanism"] == "blt" and privacy["sampling"]["kind"] == "cyclic"
    assert (privacy["neighboring_relation"] == "zero_out" and privacy["blt_buffers"] == 2
            and privacy["blt_sensitivity_sq"] > 1)
    assert summary["privacy"]["epsilon"] <= 50.0 + 1e-9
    from fedpriv.errors import ConfigError

    with pytest.raises(ConfigError, match="mechanism.buffers"):
        prepare(compose_cfg("+experiment=smoke", "mechanism=blt", "mechanism.buffers=9", run_dir=tmp_path / "x"))
    with pytest.raises(ConfigError, match="sampling=cyclic"):
        prepare(compose_cfg("+experiment=smoke", "mechanism=blt", "sampling=poisson", run_dir=tmp_path / "y"))


def test_accounting_cli_for_blt(capsys):
    import dp_accounting

    from fedpriv.accounting.__main__ import main
    from fedpriv.mechanisms.blt import planned_params

    assert main(["epsilon", "--mechanism", "blt", "--noise-multiplier", "4", "--rounds", "60", "--participations", "2",
                 "--min-separation", "29", "--delta", "1e-5", "--buffers", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # the CLI optimises the strategy for the pattern it accounts (as a run does)
    sens_sq = float(sensitivity_sq(planned_params(60, 2, "mean", 300, 2, 29).coefficients(60), 2, 29))
    assert out["blt_optimised_for"] == {"rounds": 60, "participations": 2, "min_separation": 29, "error": "mean"}
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(4 / math.sqrt(sens_sq)))
    assert out["blt_sensitivity_sq"] == pytest.approx(sens_sq) and out["neighboring_relation"] == "zero_out"
    assert out["epsilon"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
    with pytest.raises(SystemExit):
        main(["epsilon", "--mechanism", "blt", "--noise-multiplier", "4", "--rounds", "60", "--sampling", "poisson",
              "--sampling-rate", "0.1", "--delta", "1e-5"])


def test_strategy_is_optimised_for_the_samplers_pattern():
    from fedpriv.mechanisms.blt import BLTMechanism, rmse
    from fedpriv.sampling import make_sampler

    cyclic = make_sampler("cyclic", 40, 10, None)  # 12 rounds: 3 participations, 3 rounds strictly between
    fitted = BLTMechanism(2.0, 1.0, rounds=12, buffers=2, sampler=cyclic)
    single = BLTMechanism(2.0, 1.0, rounds=12, buffers=2)
    assert fitted.pattern == (3, 3) and single.pattern == (1, 0)
    assert rmse(fitted.params, 12, 3, 3) < rmse(single.params, 12, 3, 3) * 0.999
    assert fitted.accounting_details(cyclic, 12)["blt_optimised_for"]["participations"] == 3


def test_strategy_is_kept_on_disk_and_a_damaged_entry_is_recomputed(tmp_path, monkeypatch, caplog):
    from fedpriv.mechanisms import blt

    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path))
    blt.planned_params.cache_clear()
    first = blt.planned_params(30, 2, "mean", 50, 2, 9)
    (path,) = (tmp_path / "blt").glob("*.pt")
    blt.planned_params.cache_clear()
    monkeypatch.setattr(blt, "optimize", lambda *a, **k: (_ for _ in ()).throw(AssertionError("re-optimised")))
    again = blt.planned_params(30, 2, "mean", 50, 2, 9)  # from disk, not optimised
    assert torch.equal(again.weights, first.weights) and torch.equal(again.decays, first.decays)
    # a damaged entry (a decay of 1 would make the noise unbounded) is ignored, with a warning
    torch.save({"key": path.stem, "weights": first.weights, "decays": torch.ones(2, dtype=torch.float64)}, path)
    blt.planned_params.cache_clear()
    monkeypatch.undo()
    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path))
    with caplog.at_level("WARNING"):
        fixed = blt.planned_params(30, 2, "mean", 50, 2, 9)
    assert "ignoring the cached BLT strategy" in caplog.text and bool((fixed.decays < 1).all())
    blt.planned_params.cache_clear()
