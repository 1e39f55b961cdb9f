"""Adaptive clipping (privacy.clipping=adaptive): the joint (sum, count) query is one Gaussian
query of the ledger's multiplier, the release is exactly that query read back, the bound follows
the target quantile, and every mechanism runs with it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from fedpriv.round.adaptive_clipping import AdaptiveClip, build_adaptive_clip, joint_multiplier, update_noise_multiplier
from fedpriv.round.aggregation import RoundAggregate
from fedpriv.errors import ConfigError
from fedpriv.mechanisms import GaussianMechanism
from fedpriv.round.queries import QueryPlan, privatize
from fedpriv.keys.research_key import noise_from_seed
from tests.conftest import compose_cfg

SMOKE = ("+experiment=smoke", "progress=false", "privacy.clipping=adaptive")


def _clip(bound=0.5, sigma=1.2, count_noise=2.0, **kw) -> AdaptiveClip:
    return AdaptiveClip(bound=bound, target_quantile=kw.get("q", 0.5), learning_rate=kw.get("lr", 0.2),
                        count_noise=count_noise, sigma=sigma, server_step=kw.get("step", "bound"),
                        scale=kw.get("scale", 0.0))


@pytest.mark.parametrize("sigma,count_noise", [(0.58, 7.5), (1.2, 2.0), (3.49, 1.8), (1.0, 0.51)])
def test_update_multiplier_makes_the_pair_one_gaussian_query_of_multiplier_sigma(sigma, count_noise):
    z = update_noise_multiplier(sigma, count_noise)
    assert z == pytest.approx((sigma ** -2 - (2 * count_noise) ** -2) ** -0.5, rel=1e-14)
    assert z > sigma  # the count's share of the budget comes out of the update's
    assert joint_multiplier(z, count_noise) == pytest.approx(sigma, rel=1e-12)


def test_count_noise_at_or_below_half_sigma_is_refused():
    for count_noise in (0.5, 0.3):
        with pytest.raises(ConfigError, match="count_noise"):
            update_noise_multiplier(1.0, count_noise)
    assert update_noise_multiplier(0.0, 0.1) == 0.0  # non-private: no noise to split


def test_each_users_normalised_contribution_has_unit_norm_at_most():
    """y_u = ((σ/z_Δ)·c_u/C_t, (σ/σ_b)(b_u − ½)): ‖y_u‖ ≤ 1, with equality for a clipped user."""
    clip = _clip(sigma=1.3, count_noise=1.1)
    s = clip.sigma
    for norm_ratio, bit in ((1.0, 1), (1.0, 0), (0.3, 1)):  # clipped (norm C_t), or inside
        y_sq = (s / clip.update_multiplier * norm_ratio) ** 2 + (s / clip.count_noise * (bit - 0.5)) ** 2
        assert y_sq <= 1 + 1e-12
    assert (s / clip.update_multiplier) ** 2 + (s / clip.count_noise / 2) ** 2 == pytest.approx(1.0, rel=1e-12)


def test_release_is_the_unit_sensitivity_stream_read_back_block_by_block():
    """The released update and count are linear in (Σ_u y_u + σ·w): subtracting the exact sums
    leaves the mechanism's own draw, scaled by C_t·z_Δ/σ and σ_b/σ — nothing else is added."""
    torch.manual_seed(0)
    d, denominator = 50, 6.0
    clip = _clip(bound=0.7, sigma=1.2, count_noise=2.0)
    mech = GaussianMechanism(1.2, 1.0, noise=noise_from_seed(3))  # unit sensitivity
    agg = RoundAggregate.zeros(d, clip.bound)
    deltas = [torch.randn(d) * s for s in (0.01, 0.05, 0.2, 1.0, 3.0)]
    for delta in deltas:
        agg.add(delta)
    assert agg.clipped == sum(float(torch.linalg.vector_norm(x)) > 0.7 for x in deltas)
    noise = mech.noise(0, (d + 1,))
    release = privatize(agg, noise, QueryPlan(), mech, denominator, clip=clip)
    update_noise = (release.update * denominator - agg.total) / (clip.bound * clip.update_multiplier / clip.sigma)
    torch.testing.assert_close(update_noise, noise[:-1], rtol=1e-4, atol=1e-5)
    centred = (agg.accepted - agg.clipped) - agg.accepted / 2
    count_noise = ((release.unclipped_fraction - 0.5) * denominator - centred) / (clip.count_noise / clip.sigma)
    assert count_noise == pytest.approx(float(noise[-1]), rel=1e-6)


def test_noise_std_of_update_and_count_statistically():
    """Per coordinate: update noise std z_Δ·C_t on the sum, count noise std σ_b (independent noise)."""
    d, rounds = 20_000, 400
    clip = _clip(bound=0.3, sigma=0.9, count_noise=1.5)
    mech = GaussianMechanism(0.9, 1.0, noise=noise_from_seed(11))
    agg = RoundAggregate.zeros(d, clip.bound)
    release = privatize(agg, mech.noise(0, (d + 1,)), QueryPlan(), mech, 1.0, clip=clip)
    assert float(release.update.std()) == pytest.approx(clip.bound * clip.update_multiplier, rel=0.03)
    counts = [privatize(RoundAggregate.zeros(3, clip.bound), mech.noise(0, (4,)), QueryPlan(), mech, 1.0,
                        clip=clip).unclipped_fraction - 0.5 for _ in range(rounds)]
    assert float(np.std(counts)) == pytest.approx(1.5, rel=0.12)


@pytest.mark.parametrize("start", [0.05, 5.0])
def test_bound_converges_to_the_target_quantile_of_the_norms(start):
    """Norms lognormal with median 0.4: from C₀ = 0.05 or 5 the bound reaches the median (γ = 0.5)
    and the 0.8-quantile (γ = 0.8) within 10%, with the default count noise (cohort 150 / 20)."""
    rng = np.random.default_rng(0)
    for quantile, expected in ((0.5, 0.4), (0.8, 0.4 * math.exp(0.5 * 0.8416))):
        clip = _clip(bound=start, sigma=0.6, count_noise=7.5, q=quantile)
        noise = noise_from_seed(1)
        for _ in range(300):
            norms = 0.4 * np.exp(0.5 * rng.standard_normal(150))
            unclipped = int((norms <= clip.bound).sum())
            b = clip.unclipped_fraction(150, 150 - unclipped, float(noise.normal((1,))) * clip.sigma, 150.0)
            clip.step(b)
        assert clip.bound == pytest.approx(expected, rel=0.1)


def test_ime_and_a_too_small_count_noise_are_refused(tmp_path):
    from fedpriv.runner import prepare

    with pytest.raises(ConfigError, match="privacy.clipping=fixed"):
        prepare(compose_cfg(*SMOKE, "optimizer=dpadam_ime", run_dir=tmp_path / "a"))
    with pytest.raises(ConfigError, match="count_noise"):
        prepare(compose_cfg(*SMOKE, "privacy.adaptive.count_noise=0.01", run_dir=tmp_path / "b"))
    with pytest.raises(ConfigError, match="privacy.adaptive.target_quantile"):
        prepare(compose_cfg(*SMOKE, "privacy.adaptive.target_quantile=1.0", run_dir=tmp_path / "c"))
    from fedpriv.schema import Privacy, load

    def spec(clipping):
        return load(Privacy, {"clipping": clipping, "clip_norm": 1.0}, "privacy")

    assert build_adaptive_clip(spec("fixed"), 1.0, 10) is None
    assert build_adaptive_clip(spec("adaptive"), 1.0, 100).count_noise == 5.0


MECHANISMS = [("mechanism=gaussian",), ("mechanism=tree",), ("mechanism=bandmf", "mechanism.bands=2"),
              ("mechanism=blt", "mechanism.buffers=2")]


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m[0].split("=")[1])
def test_every_mechanism_runs_with_adaptive_clipping_at_the_fixed_clips_epsilon(tmp_path, mechanism):
    from fedpriv.runner import prepare
    from server.app import run_local

    adaptive = run_local(prepare(compose_cfg(*SMOKE, *mechanism, "rounds=4", run_dir=tmp_path / "a")))
    fixed = run_local(prepare(compose_cfg(*SMOKE, *mechanism, "rounds=4", "privacy.clipping=fixed",
                                          run_dir=tmp_path / "f")))
    privacy = json.loads((tmp_path / "a" / "privacy.json").read_text())
    fixed_privacy = json.loads((tmp_path / "f" / "privacy.json").read_text())
    # the ledger's event and multiplier are the fixed clip's: the count is paid for by the update
    for key in ("epsilon", "noise_multiplier", "events", "neighboring_relation"):
        assert privacy[key] == fixed_privacy[key], key
    query = privacy["clipping"]
    assert query["query"] == "adaptive_clipping_joint_gaussian" and "clipping" not in fixed_privacy
    assert joint_multiplier(query["update_noise_multiplier"], query["count_noise_std"]) == pytest.approx(
        privacy["noise_multiplier"], rel=1e-12)
    rows = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    bounds = [r["clip_norm"] for r in rows]
    assert bounds[0] == 0.5 and len(set(bounds)) == len(bounds)  # C_0, then one step per round
    for row, nxt in zip(rows[1:], rows[2:]):  # C_{t+1} = C_t exp(-η (1 - clipped_t - γ))
        assert nxt["clip_norm"] == pytest.approx(
            row["clip_norm"] * math.exp(-0.2 * (1 - row["privatized_clipped_fraction"] - 0.5)), rel=1e-12)
    assert adaptive["final_clip_norm"] == pytest.approx(
        bounds[-1] * math.exp(-0.2 * (0.5 - rows[-1]["privatized_clipped_fraction"])), rel=1e-12)
    assert "clip_norm" not in json.loads((tmp_path / "f" / "metrics.jsonl").read_text().splitlines()[0])
    del fixed


def test_resume_keeps_the_bound_and_equals_an_uninterrupted_run(tmp_path):
    from fedpriv.runner import prepare
    from server.app import run_local
    from tests.helpers import interrupt_and_resume

    over = (*SMOKE, "mechanism=blt", "mechanism.buffers=2", "rounds=4")
    whole = prepare(compose_cfg(*over, run_dir=tmp_path / "w"))
    run_local(whole)
    first, resumed = interrupt_and_resume(compose_cfg(*over, run_dir=tmp_path / "p"), 2)
    assert resumed.start_round == 2 and resumed.server.clip_norm == first.server.clip_norm != 0.5
    run_local(resumed)
    torch.testing.assert_close(resumed.server.params, whole.server.params, rtol=0, atol=0)
    assert resumed.server.clip_norm == whole.server.clip_norm


@pytest.mark.parametrize("algorithm", [("algorithm=dp_fedsgd",), ("algorithm=dpsgd", "cohort_size=40")],
                         ids=["one_pass_fedsgd", "central_dpsgd"])
def test_batched_book_keeping_rounds_clip_to_the_current_bound(tmp_path, algorithm, monkeypatch):
    from fedpriv.round.cohort import CohortClipper
    from fedpriv.runner import prepare
    from server.app import run_local

    session = prepare(compose_cfg(*SMOKE, *algorithm, "rounds=3", run_dir=tmp_path / "r"))
    seen = []
    original = CohortClipper.set_clip_norm

    def spy(self, clip_norm):
        original(self, clip_norm)
        seen.append((session.server.clip_norm, self.bk.clip_norm * self.lr))

    monkeypatch.setattr(CohortClipper, "set_clip_norm", spy)
    run_local(session)
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [bound for bound, _ in seen] == [r["clip_norm"] for r in rows] and len({b for b, _ in seen}) == 3
    for bound, engine in seen:  # Book-Keeping clips each unit's delta (−lr·g) to this round's bound
        assert engine == pytest.approx(bound, rel=1e-12)


def test_normalized_step_is_the_bound_step_times_s_over_c_t():
    """step=normalized releases S/C_t times what step=bound releases (post-processing by a public
    factor): the update, and the noise std the plan reads; the count is untouched."""
    d, denominator = 40, 6.0
    gen = torch.Generator().manual_seed(2)
    deltas = [torch.randn(d, generator=gen) * s for s in (0.05, 0.3, 2.0)]
    releases = {}
    for step in ("bound", "normalized"):
        clip = _clip(bound=0.7, sigma=1.2, count_noise=2.0, step=step, scale=0.5)
        mech = GaussianMechanism(1.2, 1.0, noise=noise_from_seed(3))
        agg = RoundAggregate.zeros(d, clip.bound)
        for delta in deltas:
            agg.add(delta)
        releases[step] = privatize(agg, mech.noise(0, (d + 1,)), QueryPlan(noise_std=True), mech, denominator,
                                   clip=clip)
    torch.testing.assert_close(releases["normalized"].update, releases["bound"].update * (0.5 / 0.7),
                               rtol=1e-6, atol=1e-7)
    assert releases["normalized"].noise_std == pytest.approx(releases["bound"].noise_std * 0.5 / 0.7, rel=1e-12)
    assert releases["normalized"].unclipped_fraction == releases["bound"].unclipped_fraction


@pytest.mark.parametrize("bound", [0.01, 1.0, 1000.0])
def test_normalized_step_noise_does_not_grow_with_the_bound(bound):
    """The feedback that made step=bound diverge at strong privacy: its step noise is C_t·z_Δ/D,
    the normalized step's is S·z_Δ/D whatever C_t (here measured on 20,000 coordinates)."""
    d = 20_000
    clip = _clip(bound=bound, sigma=0.9, count_noise=1.5, step="normalized", scale=0.5)
    mech = GaussianMechanism(0.9, 1.0, noise=noise_from_seed(4))
    release = privatize(RoundAggregate.zeros(d, clip.bound), mech.noise(0, (d + 1,)), QueryPlan(), mech, 1.0,
                        clip=clip)
    assert float(release.update.std()) == pytest.approx(0.5 * clip.update_multiplier, rel=0.03)
    bounded = _clip(bound=bound, sigma=0.9, count_noise=1.5, step="bound")
    release = privatize(RoundAggregate.zeros(d, bounded.bound), mech.noise(1, (d + 1,)), QueryPlan(), mech, 1.0,
                        clip=bounded)
    assert float(release.update.std()) == pytest.approx(bound * bounded.update_multiplier, rel=0.03)


def test_the_config_separates_the_initial_bound_from_the_step_scale():
    from fedpriv.schema import Privacy

    privacy = Privacy(clip_norm=0.5, clipping="adaptive")
    privacy.adaptive.initial_bound = 5.0
    clip = build_adaptive_clip(privacy, sigma=0.6, expected_cohort=150)
    assert (clip.bound, clip.initial, clip.scale, clip.server_step) == (5.0, 5.0, 0.5, "normalized")
    assert clip.release_factor == pytest.approx(0.1)
    described = clip.describe()
    assert described["server_step"] == "normalized" and described["step_scale"] == 0.5
    privacy.adaptive.step = "bound"
    privacy.adaptive.initial_bound = None
    clip = build_adaptive_clip(privacy, sigma=0.6, expected_cohort=150)
    assert (clip.bound, clip.release_factor) == (0.5, 1.0) and "step_scale" not in clip.describe()


def test_default_count_noise_caps_the_counts_share_of_the_budget():
    """σ_b = max(m/20, σ·√10/2): Andrew et al.'s m/20 where the noise is weak; where it is strong
    the count takes at most a tenth of the query's precision, so z_Δ ≤ σ/√0.9."""
    from fedpriv.round.adaptive_clipping import default_count_noise

    assert default_count_noise(150, 0.58) == 7.5
    sigma_b = default_count_noise(150, 11.77)
    assert sigma_b == pytest.approx(11.77 * math.sqrt(10) / 2)
    assert update_noise_multiplier(11.77, sigma_b) == pytest.approx(11.77 / math.sqrt(0.9), rel=1e-12)
    assert update_noise_multiplier(11.77, 7.5) > 1.6 * 11.77  # what m/20 alone cost the tree at ε = 2
