"""An epsilon *estimate* (not a bound) from the scores of inserted and never-inserted canaries.

Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning": fit one Gaussian
to the scores of the inserted canaries, N(μ₁, s₁²), and one to those of canaries that were never
inserted, N(μ₀, s₀²); report the ε at the run's δ of the mechanism whose two output
distributions are those Gaussians:

    δ(ε) = max over both orders of  ∫ (p₁(x) − e^ε p₀(x))₊ dx,   ε̂ = min{ε ≥ 0 : δ(ε) ≤ δ}.

The integrand is positive exactly where the log-likelihood ratio, a quadratic in x, exceeds ε,
so each δ(ε) is a sum of Gaussian tail masses over at most two intervals. With s₀ = s₁ it is the
Gaussian mechanism with μ = |μ₁ − μ₀|/s (Gaussian DP), which :func:`estimate_epsilon` also
reports with the pooled standard deviation (``epsilon_equal_variance``): at small δ the
two-variance figure is driven by the ratio s₁/s₀ in the tails, and max-over-rounds scores of
sampled canaries are a mixture (a canary takes part in 0, 1, 2, ... rounds), so the two can differ
a lot. The fit assumes Gaussian scores; it says what the run's canaries suggest, with no
confidence attached.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import norm

EPS_MAX = 100.0  # the search's ceiling: an estimate equal to it means "at least EPS_MAX" (saturated)


def _region(mu1: float, s1: float, mu0: float, s0: float, epsilon: float) -> list[tuple[float, float]]:
    """Intervals where log p₁(x) − log p₀(x) > ε (p_i the density of N(μ_i, s_i²))."""
    a = 0.5 / s0 ** 2 - 0.5 / s1 ** 2
    b = mu1 / s1 ** 2 - mu0 / s0 ** 2
    c = mu0 ** 2 / (2 * s0 ** 2) - mu1 ** 2 / (2 * s1 ** 2) + math.log(s0 / s1) - epsilon
    inf = math.inf
    if abs(a) < 1e-12 * max(abs(b), 1e-300):  # linear: b x + c > 0
        if b == 0:
            return [(-inf, inf)] if c > 0 else []
        root = -c / b
        return [(root, inf)] if b > 0 else [(-inf, root)]
    disc = b * b - 4 * a * c
    if disc <= 0:
        return [(-inf, inf)] if a > 0 else []
    r1, r2 = sorted(((-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)))
    return [(-inf, r1), (r2, inf)] if a > 0 else [(r1, r2)]


def _mass(mu: float, s: float, intervals: list[tuple[float, float]]) -> float:
    return sum(float(norm.cdf(hi, mu, s) - norm.cdf(lo, mu, s)) if hi <= mu else
               float(norm.sf(lo, mu, s) - norm.sf(hi, mu, s)) for lo, hi in intervals)


def gaussian_delta(mu1: float, s1: float, mu0: float, s0: float, epsilon: float) -> float:
    """δ(ε) of the pair N(μ₁, s₁²), N(μ₀, s₀²), the larger of the two orders."""
    out = 0.0
    for (ma, sa), (mb, sb) in (((mu1, s1), (mu0, s0)), ((mu0, s0), (mu1, s1))):
        region = _region(ma, sa, mb, sb, epsilon)
        out = max(out, _mass(ma, sa, region) - math.exp(epsilon) * _mass(mb, sb, region))
    return max(out, 0.0)


def gaussian_epsilon(mu1: float, s1: float, mu0: float, s0: float, delta: float, tol: float = 1e-6) -> float:
    """The smallest ε with δ(ε) ≤ δ for the two Gaussians (bisection; δ(ε) decreases in ε), or
    :data:`EPS_MAX` when even δ(EPS_MAX) > δ (the estimate is then only known to exceed it)."""
    if not (s1 > 0 and s0 > 0 and 0 < delta < 1):
        raise ValueError(f"need positive standard deviations and delta in (0, 1), got {s1}, {s0}, {delta}")
    if gaussian_delta(mu1, s1, mu0, s0, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while gaussian_delta(mu1, s1, mu0, s0, hi) > delta:
        if hi >= EPS_MAX:
            return EPS_MAX
        lo, hi = hi, min(2 * hi, EPS_MAX)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gaussian_delta(mu1, s1, mu0, s0, mid) > delta else (lo, mid)
    return hi


def estimate_epsilon(inserted: Sequence[float], never_inserted: Sequence[float], delta: float) -> dict:
    """Fit both Gaussians (mean, sample std) and return them with the ε estimate."""
    x1 = np.asarray(inserted, dtype=np.float64)
    x0 = np.asarray(never_inserted, dtype=np.float64)
    if x1.size < 2 or x0.size < 2:
        raise ValueError("the Gaussian fit needs at least two inserted and two never-inserted canaries")
    mu1, s1, mu0, s0 = float(x1.mean()), float(x1.std(ddof=1)), float(x0.mean()), float(x0.std(ddof=1))
    pooled = math.sqrt(((x1.size - 1) * s1 ** 2 + (x0.size - 1) * s0 ** 2) / (x1.size + x0.size - 2))
    tiny = 1e-12 * max(abs(mu1), abs(mu0), s1, s0, 1e-300)
    if max(s1, s0) <= tiny:  # constant scores: two different points are told apart exactly
        epsilon = equal = 0.0 if mu1 == mu0 else EPS_MAX
    else:
        epsilon = gaussian_epsilon(mu1, max(s1, tiny), mu0, max(s0, tiny), delta)
        equal = gaussian_epsilon(mu1, pooled, mu0, pooled, delta)
    return {"epsilon_estimate": epsilon, "epsilon_equal_variance": equal, "inserted_mean": mu1, "inserted_std": s1,
            "never_inserted_mean": mu0, "never_inserted_std": s0}
