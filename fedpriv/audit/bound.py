"""The one-run lower bound on epsilon, from guesses about canaries included by secret coins.

Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run" (2023): ``m`` canaries are
each included in the training input independently with probability ½. From the output alone, the
auditor guesses "included" for ``r`` of them; ``v`` guesses are right. If the mechanism is
(ε, δ)-DP with respect to each canary's inclusion, then (their Theorem 5.2, with δ)

    P[V ≥ v] ≤ f(v) + 2mδ · max_{1≤i≤v} (f(v − i) − f(v)) / i,
    f(k) = P[Binomial(r, q) ≥ k],   q = e^ε / (1 + e^ε),

so ``p(ε) = min(1, right-hand side)`` is a p-value for the claim (ε, δ). It grows with ε; the
claim is rejected at confidence ``c`` when ``p(ε) ≤ 1 − c``, and the lower bound is the largest
rejected ε (0 when even ε = 0 survives). With δ = 0 the test is exact for randomized response.

Choosing how many guesses to make after seeing the scores is a multiple test:
:func:`one_run_audit` tries a fixed grid of guess counts on each score and tests every
(score, count) pair at level ``(1 − c) / pairs`` (Bonferroni), so the reported maximum holds at
confidence ``c``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy.stats import binom

EPS_MAX = 100.0  # search ceiling: a bound this large means "no noise at all"


def p_value(m: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """The one-run p-value of ``correct`` right guesses out of ``guesses`` among ``m`` canaries
    under the claim (ε, δ)."""
    _check_counts(m, guesses, correct)
    if not (epsilon >= 0 and 0 <= delta <= 1):
        raise ValueError(f"need epsilon >= 0 and delta in [0, 1], got {epsilon}, {delta}")
    if correct == 0:
        return 1.0
    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = binom.sf(correct - 1, guesses, q)  # f(v) = P[Bin(r, q) >= v]
    if delta == 0:
        return float(min(1.0, tail))
    i = np.arange(1, correct + 1)
    alpha = float(np.max((binom.sf(correct - i - 1, guesses, q) - tail) / i))
    return float(min(1.0, tail + 2.0 * m * delta * max(alpha, 0.0)))


def epsilon_lower_bound(m: int, guesses: int, correct: int, delta: float, confidence: float = 0.95,
                        tol: float = 1e-6) -> float:
    """The largest ε whose claim (ε, δ) the counts reject at ``confidence`` (bisection on the
    increasing p-value; 0 when ε = 0 is not rejected)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    level = 1.0 - confidence
    if p_value(m, guesses, correct, 0.0, delta) > level:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, guesses, correct, hi, delta) <= level:
        lo, hi = hi, 2.0 * hi
        if hi > EPS_MAX:
            return lo  # rejected at every ε tried (q is 1 in float64 long before this)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if p_value(m, guesses, correct, mid, delta) <= level else (lo, mid)
    return lo


def guess_grid(m: int) -> list[int]:
    """Guess counts tried: 1, 2, 5, 10, 20, 50, ... up to ``m`` (fixed before seeing scores)."""
    out, base = [], 1
    while base <= m:
        out += [k for k in (base, 2 * base, 5 * base) if k <= m]
        base *= 10
    return out


@dataclass(frozen=True)
class OneRunResult:
    """The best (score, guess count) of a one-run audit, Bonferroni-corrected over all pairs tried."""

    canaries: int  # m: canaries with a coin
    guesses: int
    correct: int
    epsilon_lower_bound: float
    confidence: float
    score: str  # which score the best pair used
    hypotheses: int  # (score, guess count) pairs tested

    def to_dict(self) -> dict:
        return asdict(self)


def one_run_audit(scores: Mapping[str, Sequence[float]], coins: Sequence[bool], delta: float,
                  confidence: float = 0.95) -> OneRunResult:
    """Guess "included" for the top-k canaries of each score (higher: more likely included; ties
    broken by canary index, which is independent of the coins), for every k of
    :func:`guess_grid`; the largest bound over all pairs, each tested at ``(1 − c)/pairs``."""
    included = np.asarray(coins, dtype=bool)
    m = included.size
    grid = guess_grid(m)
    pairs = len(grid) * len(scores)
    if m == 0 or pairs == 0:
        raise ValueError("an audit needs at least one canary and one score")
    corrected = 1.0 - (1.0 - confidence) / pairs
    best = OneRunResult(m, 0, 0, 0.0, confidence, next(iter(scores)), pairs)
    for name, values in scores.items():
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (m,):
            raise ValueError(f"score {name!r} has shape {values.shape}, expected ({m},)")
        order = np.lexsort((np.arange(m), -values))  # descending score, then index
        hits = np.cumsum(included[order])
        for k in grid:
            bound = epsilon_lower_bound(m, k, int(hits[k - 1]), delta, corrected)
            if bound > best.epsilon_lower_bound:
                best = OneRunResult(m, k, int(hits[k - 1]), bound, confidence, name, pairs)
    return best


def _check_counts(m: int, guesses: int, correct: int) -> None:
    if not 0 <= correct <= guesses <= m:
        raise ValueError(f"need 0 <= correct <= guesses <= canaries, got {correct}, {guesses}, {m}")
