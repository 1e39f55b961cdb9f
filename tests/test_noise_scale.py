"""Before training, a run says how much noise its averaged update gets (σ/m̄ per coordinate and
σ·√d/m̄ in norm, in units of the clip bound; privacy.json ``averaged_noise_to_clip`` and
``averaged_noise_norm_to_clip``) and warns when it is too large to learn."""

from __future__ import annotations

import json
import logging
import math

import pytest

from conftest import compose_cfg
from fedpriv.plan.noise_figure import A_WARN
from fedpriv.runner import prepare


def _prepare(tmp_path, caplog, *overrides):
    with caplog.at_level(logging.INFO, logger="fedpriv"):
        session = prepare(compose_cfg("+experiment=smoke", *overrides, run_dir=tmp_path / "run"))
    session.run.unlock()
    return session, [r for r in caplog.records if "the averaged update gets noise" in r.getMessage()]


@pytest.mark.parametrize("sigma, warned", [(0.4, False), (2.0, True)])
def test_the_noise_on_the_averaged_update_is_said_and_warned_above_the_threshold(tmp_path, caplog, sigma, warned):
    session, lines = _prepare(tmp_path, caplog, "privacy.target_epsilon=null", f"privacy.noise_multiplier={sigma}")
    ratio = sigma / 8  # smoke: expected cohort 8
    d = session.task.initial_params.numel()
    norm = ratio * math.sqrt(d)
    privacy = session.ledger.to_dict()
    assert privacy["averaged_noise_to_clip"] == pytest.approx(ratio)
    assert privacy["averaged_noise_norm_to_clip"] == pytest.approx(norm)
    assert len(lines) == 1 and f"std {ratio:.3g} x the clip bound" in lines[0].getMessage()
    assert f"of norm {norm:.3g} x the clip bound over its {d} coordinates" in lines[0].getMessage()
    noise = session.plan.noise  # smoke: momentum 0.9, cosine; a = lr·C·σ·√T / (m̄·(1 − β)), Gaussian: σ_eff = σ
    spec = session.spec
    a = spec.optimizer.lr * spec.privacy.clip_norm * sigma * math.sqrt(spec.rounds) / (8 * (1 - 0.9))
    assert noise.sigma_eff == sigma and noise.accumulated == pytest.approx(a)
    assert f"accumulates noise of std {a:.3g} per coordinate" in lines[0].getMessage()
    assert (lines[0].levelno == logging.WARNING) == warned == (a > A_WARN)


@pytest.mark.parametrize("overrides, prefix", [((), "noise multiplier "),
                                               (("privacy.target_epsilon=null", "privacy.noise_multiplier=2.0"),
                                                "warning: noise multiplier ")])
def test_privacy_json_of_a_run_records_the_ratio(tmp_path, run_cli, overrides, prefix):
    out = tmp_path / "run"
    res = run_cli("+experiment=smoke", "rounds=1", "progress=false", f"run_dir={out}", *overrides)
    assert res.returncode == 0, res.stderr
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["averaged_noise_to_clip"] == pytest.approx(privacy["noise_multiplier"] / 8)
    # advice, on stderr whatever its level (stdout holds the results only)
    assert "the averaged update gets noise" not in res.stdout
    lines = [line for line in res.stderr.splitlines() if "the averaged update gets noise of std" in line]
    assert len(lines) == 1 and lines[0].startswith(prefix), res.stderr
