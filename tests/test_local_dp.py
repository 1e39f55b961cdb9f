"""Example-level DP-SGD on clients (client.dp=example): update rule, noise scale, accounting."""

import json

import dp_accounting
import numpy as np
import pytest
import torch

from fedpriv.accounting import compute_epsilon
from fedpriv.clipping import BookKeeping
from fedpriv.errors import ConfigError
from fedpriv.round.local_dp import ExampleDP, resolve_example_dp
from fedpriv.metrics import sequence_token_losses
from fedpriv.models import build_model, get_flat_params
from fedpriv.round.training import LocalConfig, local_update

from helpers import client_draws


EXAMPLE = {"sampling_rate": 0.5, "steps": 2, "clip_norm": 1.0, "noise_multiplier": None,
           "target_epsilon": 4.0, "delta": 1e-6, "denominator": 3.0, "mode": "mixopt"}


def _model():
    torch.manual_seed(0)
    return build_model("lstm", 40, embed_dim=8, hidden_size=12, projection_dim=8)


def _rows(n, seed=0):
    rows = np.random.default_rng(seed).integers(1, 40, size=(n, 7))
    rows[0, 4:] = 0
    return rows


def test_calibrated_example_epsilon_and_event():
    dp = resolve_example_dp({"dp": "example", "example": EXAMPLE}, rounds=30)
    manual = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(dp.noise_multiplier)), 60)
    eps = compute_epsilon(manual, 1e-6, "rdp")
    assert eps <= 4.0 and eps > 3.9
    assert dp.epsilon(30) == pytest.approx(eps)
    assert resolve_example_dp({"dp": "none"}, rounds=30) is None


@pytest.mark.parametrize("field,value", [("sampling_rate", 0.0), ("sampling_rate", 1.5), ("steps", 0),
                                         ("clip_norm", -1.0), ("delta", 1.0), ("mode", "fast"),
                                         ("denominator", 0.0), ("denominator", None)])
def test_bad_example_settings_are_config_errors(field, value):
    with pytest.raises(ConfigError, match=f"client.example.{field}"):
        resolve_example_dp({"dp": "example", "example": {**EXAMPLE, field: value}}, rounds=3)
    with pytest.raises(ConfigError, match="client.dp"):
        resolve_example_dp({"dp": "user", "example": EXAMPLE}, rounds=3)


def test_noiseless_full_batch_step_is_clipped_sum_over_the_fixed_denominator():
    """q = 1, σ = 0, one step: θ' = θ − η Σ_i clip(∇ℓ_i, C) / D, ℓ_i = row i's mean token loss, D the
    configured denominator — not the client's row count n (finding 3: n is private)."""
    model, ref = _model(), _model()
    rows = _rows(6)
    params = get_flat_params(model)
    dp = ExampleDP(sampling_rate=1.0, steps=1, clip_norm=0.3, noise_multiplier=0.0, delta=1e-6, denominator=4.0)
    bk = BookKeeping(model, clip_norm=0.3, noise_multiplier=0.0)
    delta, metrics = local_update(model, params, rows, LocalConfig(lr=0.5, dp=dp), client_draws(1),
                                  bk=bk)
    expected = torch.zeros_like(params)
    norms = []
    for row in rows:
        ref.zero_grad()
        ce, count = sequence_token_losses(ref, torch.as_tensor(row[None]), 0)
        (ce / count).sum().backward()
        g = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
        norms.append(float(g.norm()))
        expected += g * min(1.0, 0.3 / float(g.norm()))
    expected *= -0.5 / 4.0
    assert max(norms) > 0.3  # clipping is exercised
    torch.testing.assert_close(delta, expected, rtol=1e-4, atol=1e-6)
    assert metrics == {}  # nothing about the rows but the delta, even when diagnostics are asked for below
    _, asked = local_update(model, params, rows, LocalConfig(lr=0.5, dp=dp), client_draws(1), bk=bk,
                            diagnostics=True)
    assert asked == {}


def test_empty_batch_still_takes_the_noise_step():
    """With q so small that no row is drawn, the step is pure noise of std η σ C / D."""
    model = _model()
    rows = _rows(4)
    params = get_flat_params(model)
    dp = ExampleDP(sampling_rate=1e-9, steps=1, clip_norm=2.0, noise_multiplier=1.5, delta=1e-6, denominator=0.5)
    bk = BookKeeping(model, clip_norm=2.0, noise_multiplier=1.5)
    delta, _ = local_update(model, params, rows, LocalConfig(lr=0.1, dp=dp), client_draws(3), bk=bk)
    std = 0.1 * 1.5 * 2.0 / 0.5
    assert float(delta.std() / std) == pytest.approx(1.0, rel=0.02)
    assert abs(float(delta.mean())) < 0.02 * std


def test_noise_std_with_data():
    """σ > 0 on a real batch: the delta minus its noiseless value has std η σ C / D."""
    rows = _rows(8)
    dp0 = ExampleDP(sampling_rate=1.0, steps=1, clip_norm=0.5, noise_multiplier=0.0, delta=1e-6, denominator=8.0)
    dp1 = ExampleDP(sampling_rate=1.0, steps=1, clip_norm=0.5, noise_multiplier=2.0, delta=1e-6, denominator=8.0)
    out = []
    for dp in (dp0, dp1):
        model = _model()
        bk = BookKeeping(model, clip_norm=0.5, noise_multiplier=dp.noise_multiplier)
        out.append(local_update(model, get_flat_params(model), rows, LocalConfig(lr=0.2, dp=dp),
                                client_draws(0), bk=bk)[0])
    noise = out[1] - out[0]
    assert float(noise.std()) == pytest.approx(0.2 * 2.0 * 0.5 / 8, rel=0.02)


def test_cli_client_example_dp(run_cli, tmp_path):
    proc = run_cli("+experiment=smoke", "client.dp=example", "client.example.target_epsilon=3",
                   "progress=false", f"run_dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr
    assert "example-level epsilon on clients" in proc.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    ex = summary["example_privacy"]
    assert 2.9 < ex["epsilon"] <= 3.0 and ex["steps_per_round"] == 4
    assert summary["privacy"]["epsilon"] <= 50.0  # the user-level guarantee still holds


def test_cli_client_example_dp_needs_dp_fedavg(run_cli, tmp_path):
    proc = run_cli("+experiment=smoke", "client.dp=example", "algorithm=dp_fedsgd", f"run_dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    assert "client.dp=example needs algorithm=dp_fedavg" in proc.stderr
    assert not (tmp_path / "run").exists()
