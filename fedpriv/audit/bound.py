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
    corrected = _corrected_confidence(m, confidence, len(scores))
    best = OneRunResult(m, 0, 0, 0.0, confidence, next(iter(scores)), pairs)
    for name, values in scores.items():
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (m,):
            raise ValueError(f"score {name!r} has shape {values.shape}, expected ({m},)")
        hits = ranked_hits(values, included)
        for k in grid:
            bound = epsilon_lower_bound(m, k, int(hits[k - 1]), delta, corrected)
            if bound > best.epsilon_lower_bound:
                best = OneRunResult(m, k, int(hits[k - 1]), bound, confidence, name, pairs)
    return best


def ranked_hits(values: np.ndarray, included: np.ndarray) -> np.ndarray:
    """``hits[k - 1]``: how many of the top ``k`` canaries by ``values`` were included (descending
    score, ties broken by canary index, which is independent of the coins)."""
    order = np.lexsort((np.arange(included.size), -values))
    return np.cumsum(included[order])


def _corrected_confidence(m: int, confidence: float, scores: int) -> float:
    """The Bonferroni-corrected confidence each (score, guess count) pair of :func:`one_run_audit`
    is tested at: ``1 − (1 − c)/pairs`` over the grid's counts for ``m`` canaries."""
    return 1.0 - (1.0 - confidence) / (len(guess_grid(m)) * scores)


def _check_counts(m: int, guesses: int, correct: int) -> None:
    if not 0 <= correct <= guesses <= m:
        raise ValueError(f"need 0 <= correct <= guesses <= canaries, got {correct}, {guesses}, {m}")



# --- can an audit give a positive bound at all? -----------------------------------------------------
#
# A bound is positive only when some (score, guess count) pair rejects ε = 0, i.e. when
# ``p(0) ≤ (1 − c)/pairs`` — the first test of :func:`epsilon_lower_bound`. Guesses are "included"
# only, so ``k`` guesses are right at most ``min(k, inserted)`` times, and at ε = 0 the p-value falls
# as the number right grows (checked in tests/test_audit.py): the best any scores can do is to rank
# every inserted canary first, giving ``min(k, inserted)`` right. The helpers below ask that best
# case, with the grid, Bonferroni level and p-value of :func:`one_run_audit`. Where the coins are not
# known yet (another canary count), ``inserted`` is :func:`likely_inserted`: at least that many are
# inserted in 95% of draws.

SEARCH_LIMIT = 20_000  # canary counts searched for one that can give a positive bound
COIN_QUANTILE = 0.05


def likely_inserted(m):
    """The 5% quantile of Binomial(m, ½): the coins insert at least this many of ``m`` canaries in
    at least 95% of draws (``m`` a number or an array)."""
    out = np.asarray(binom.ppf(COIN_QUANTILE, m, 0.5)).astype(int)
    return int(out) if out.ndim == 0 else out


def audit_level(m: int, confidence: float, scores: int) -> float:
    """The level each (score, guess count) pair of :func:`one_run_audit` is tested at, computed as
    ``1 − corrected`` exactly as :func:`epsilon_lower_bound` does."""
    return 1.0 - _corrected_confidence(m, confidence, scores)


def best_case_p_value(m: int, delta: float, inserted: int | None = None) -> tuple[float, int]:
    """(smallest p-value of ε = 0 over the grid's guess counts ``k`` when the top ``k`` hold
    ``min(k, inserted)`` inserted canaries, that ``k``); ``inserted`` defaults to :func:`likely_inserted`."""
    inserted = likely_inserted(m) if inserted is None else inserted
    return min((p_value(m, k, min(k, inserted), 0.0, delta), k) for k in guess_grid(m))


def can_certify(m: int, delta: float, confidence: float = 0.95, scores: int = 2, inserted: int | None = None) -> bool:
    """Whether :func:`one_run_audit` over ``m`` canaries (``inserted`` of them inserted; default
    :func:`likely_inserted`) and ``scores`` scores can give a positive bound at (δ, confidence) for the best
    possible scores."""
    return m >= 1 and best_case_p_value(m, delta, inserted)[0] <= audit_level(m, confidence, scores)


def largest_certifiable_delta(m: int, confidence: float = 0.95, scores: int = 2,
                              inserted: int | None = None) -> float | None:
    """The largest δ (to 0.2%, from below) at which :func:`can_certify` holds; None when even δ = 0
    fails (too few canaries). The p-value grows with δ, so bisect on log δ."""
    if not can_certify(m, 0.0, confidence, scores, inserted):
        return None
    if can_certify(m, 1.0, confidence, scores, inserted):
        return 1.0
    lo, hi = 1e-30, 1.0
    if not can_certify(m, lo, confidence, scores, inserted):
        return 0.0
    while hi / lo > 1.002:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if can_certify(m, mid, confidence, scores, inserted) else (lo, mid)
    return lo


def zero_epsilon_p_values(m: np.ndarray, guesses: int, correct: np.ndarray, delta: float) -> np.ndarray:
    """:func:`p_value` at ε = 0 for many ``(m, correct)`` with one guess count, elementwise (the
    same terms and arithmetic; the binomial tails are computed once)."""
    m, correct = np.asarray(m), np.asarray(correct)
    f = binom.sf(np.arange(-1, guesses), guesses, 0.5)  # f[j] = P[Binomial(guesses, 1/2) >= j]
    alpha = {}
    for v in np.unique(correct).tolist():
        if v > 0:
            j = np.arange(v)
            alpha[v] = max(float(np.max((f[j] - f[v]) / (v - j))), 0.0)
    out = np.ones(m.shape)
    for v, a in alpha.items():
        at = correct == v
        out[at] = np.minimum(1.0, f[v] + 2.0 * m[at] * delta * a)
    return out


def certifiable_counts(delta: float, limit: int, confidence: float = 0.95, scores: int = 2) -> np.ndarray:
    """``ok[m]`` for m = 0..limit: whether ``m`` canaries, :func:`likely_inserted` of them, can give a
    positive bound at (δ, confidence) (:func:`can_certify` for every ``m`` at once)."""
    ms = np.arange(limit + 1)
    grid = np.asarray(guess_grid(max(limit, 1)))
    pairs = np.searchsorted(grid, ms, side="right") * scores
    with np.errstate(divide="ignore"):
        level = 1.0 - (1.0 - (1.0 - confidence) / pairs)
    ok = np.zeros(limit + 1, dtype=bool)
    for k in grid.tolist():
        at = ms[k:]
        if at.size:
            ok[k:] |= zero_epsilon_p_values(at, k, np.minimum(k, likely_inserted(at)), delta) <= level[k:]
    ok[:2] = False  # an audit needs two canaries
    return ok


def certifiable_ceiling(delta: float, confidence: float = 0.95, scores: int = 2) -> int | None:
    """A canary count from which on no count can give a positive bound at δ: every p-value of ε = 0
    is at least ``f + 2δ(1 − f) ≥ 2δ`` (``f`` the tail at ``v ≥ 1`` right; the i = v term of α is
    ``(1 − f)/v`` and m ≥ v), and the level only falls as the count grows. None when 2δ > 1."""
    if 2 * delta > 1 or delta <= 0:
        return None
    base = 1
    while True:
        for start in (base, 2 * base, 5 * base):  # the level changes only where the grid grows
            if audit_level(start, confidence, scores) < 2 * delta:
                return start
        base *= 10


def correct_needed(m: int, guesses: int, delta: float, level: float) -> int | None:
    """The fewest right guesses out of ``guesses`` whose p-value of ε = 0 is at most ``level`` (the
    p-value falls as the number right grows), or None when even every guess right is not enough."""
    if p_value(m, guesses, guesses, 0.0, delta) > level:
        return None
    lo, hi = 0, guesses  # lo is not enough (p = 1 with none right), hi is
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if p_value(m, guesses, mid, 0.0, delta) <= level else (mid, hi)
    return hi
