"""BLT strategies (fedpriv/mechanisms/blt.py): the online generator equals the explicit C⁻¹Z,
the closed-form min-separation sensitivity equals brute force, the error equals the explicit
prefix-sum error, and the optimiser beats the tree and independent noise."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from conftest import ROOT
from helpers import sensitivity_sq_brute_force

from fedpriv.mechanisms.analysis import prefix_rmse
from fedpriv.mechanisms.blt import BLTParams, error, inverse_noise, optimize, rmse, sensitivity_sq

torch.set_num_threads(1)


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
        return subprocess.run([sys.executable, "-m", "fedpriv.mechanisms", "rmse", *args], cwd=ROOT,
                              capture_output=True, text=True)

    res = cli("--mechanism", "blt", "--rounds", "64", "--buffers", "2", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["buffers"] == 2 and math.isfinite(out["rmse"])
    params = BLTParams(torch.tensor(out["weights"], dtype=torch.float64), torch.tensor(out["decays"], dtype=torch.float64))
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
