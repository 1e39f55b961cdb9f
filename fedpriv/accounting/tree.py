"""Privacy of tree-aggregation noise (DP-FTRL), for a user taking part k times.

A user's contribution to the rounds it takes part in reaches every *completed* dyadic interval
(tree node) of rounds containing one of them; node noise is N(0, σ²C²). With c_I participations
inside node I, the node's sensitivity is c_I·C, so the release is a Gaussian mechanism with
``Σ sens² = Σ_I c_I²`` (units C²): ρ-zCDP with ρ = Σ sens²/(2σ²), i.e. a Gaussian of multiplier
``σ/√(Σ sens²)`` — what :func:`tree_accounting` hands to dp_accounting. The worst case over placements
of k participations with at least s rounds strictly between consecutive ones is found exactly by
:func:`max_sensitivity_sq`, a dynamic program over the tree.

Single epoch (k = 1) uses dp_accounting's ``SingleEpochTreeAggregationDpEvent(σ, T)``, whose RDP
is the same Gaussian with ⌊log2 T⌋+1 nodes. Both are under zero-out (REPLACE_SPECIAL)
neighbouring: a user's updates replaced by zeros. With restarts every r rounds a user's
participations fall into ⌈T/r⌉ trees; fedpriv composes the per-tree events, placing the user's
participations in each tree in the worst way (conservative: it ignores that the placements in
different trees are coupled by the separation).
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import dp_accounting
import numpy as np

from fedpriv.errors import ConfigError

log = logging.getLogger(__name__)

NEG = -np.inf
# What the exact dynamic program may cost, estimated up front, before it hands over to the
# per-level bound: max-plus additions (about 7e8 a second here, in float64 — exact for every
# integer below 2^53 — so 7e9 is ~10 s) and the bytes of the tables it keeps.
EXACT_WORK_LIMIT = 7e9
EXACT_MEMORY_LIMIT = 1 << 30


@dataclass(frozen=True)
class TreeSensitivity:
    """``Σ_I c_I²`` of a participation pattern and how it was obtained: ``exact`` (the dynamic
    program), or ``per-level bound`` (a proven upper bound, used where the exact program would
    need more than :data:`EXACT_WORK_LIMIT` operations)."""

    sum_sq: int
    method: str
    participations: int
    separation: int
    rounds: int


# ---------------------------------------------------------------- exact dynamic program
#
# For a subtree of m = 2^h leaves holding `fill` rounds (leaves at or beyond T are not rounds), the
# table best[c, lo, hi] is the largest Σ c_I² over the *completed* nodes inside the subtree, among
# placements of exactly c participations in it (consecutive ones with at least `sep` rounds
# strictly between), with lo / hi free rounds before the first / after the last participation,
# capped at min(sep, m) (a gap of sep or more satisfies every constraint). Identical subtrees —
# the same (height, fill) — share one table, so a tree over T leaves needs O(log T) tables, not
# 2T. A dimension nobody above reads is reduced by a max: the root reads neither lo nor hi, the
# nodes on the path to the last round read lo only (nothing lies to their right), so only full
# subtrees below the top keep both and pay the cubic max-plus product.


def _count_cap(fill: int, k: int, sep: int) -> int:
    """At most ⌈fill/(sep+1)⌉ participations fit in ``fill`` consecutive rounds."""
    return min(k, -(-fill // (sep + 1)))


def _dims(h: int, sep: int, need_lo: bool, need_hi: bool) -> tuple[int, int]:
    full = min(sep, 2 ** h) + 1
    return (full if need_lo else 1), (full if need_hi else 1)


def _cost(h: int, fill: int, k: int, sep: int, need_lo: bool, need_hi: bool, seen: set) -> tuple[float, float]:
    """(max-plus additions, bytes of the tables kept) of table(h, fill, need_lo, need_hi), children
    counted once each — what :func:`_exact` will do, before it does it."""
    key = (h, fill, need_lo, need_hi)
    if key in seen:
        return 0.0, 0.0
    seen.add(key)
    d_lo, d_hi = _dims(h, sep, need_lo, need_hi)
    size = 8.0 * (_count_cap(fill, k, sep) + 1) * d_lo * d_hi
    if h == 0:
        return 0.0, size
    half = 2 ** (h - 1)
    lf, rf = min(fill, half), fill - min(fill, half)
    pairs = _count_cap(lf, k, sep) * _count_cap(rf, k, sep)
    work, memory = float(d_lo) * (min(sep, half) + 1) * d_hi * pairs, 3 * size  # + the max-plus scratch
    for child in ((h - 1, lf, k, sep, need_lo, True), (h - 1, rf, k, sep, True, need_hi)):
        w, m = _cost(*child, seen)
        work, memory = work + w, memory + m
    return work, memory


def _leaf(inside: bool, k: int, sep: int) -> np.ndarray:
    cap = min(sep, 1)
    table = np.full((_count_cap(int(inside), k, sep) + 1, cap + 1, cap + 1), NEG, dtype=np.float64)
    table[0, cap, cap] = 0.0  # no participation: the whole leaf is free
    if inside and k >= 1:
        table[1, 0, 0] = 1.0  # the leaf node itself is completed: c² = 1
    return table


def _reduce(table: np.ndarray, need_lo: bool, need_hi: bool) -> np.ndarray:
    if not need_lo:
        table = table.max(axis=1, keepdims=True)
    if not need_hi:
        table = table.max(axis=2, keepdims=True)
    return table


def _combine(left: np.ndarray, right: np.ndarray, half: int, sep: int, k: int, completed: bool,
             d_lo: int, d_hi: int) -> np.ndarray:
    """The parent (2·half leaves) of two child tables holding at most ``k`` participations (the
    parent's count cap); ``d_lo`` / ``d_hi`` are the parent's dims (1: that side is reduced, and so
    is the matching side of the child that feeds it)."""
    cap = min(sep, 2 * half)
    a_l, a_r = left.shape[0] - 1, right.shape[0] - 1
    out = np.full((min(k, a_l + a_r) + 1, d_lo, d_hi), NEG, dtype=np.float64)
    a_l, a_r = min(a_l, k), min(a_r, k)
    lo_index = (lambda value: min(value, cap)) if d_lo > 1 else (lambda value: 0)
    hi_index = (lambda value: min(value, cap)) if d_hi > 1 else (lambda value: 0)
    out[0, lo_index(2 * half), hi_index(2 * half)] = 0.0
    # right child empty: the parent's hi is the left's hi plus the right's half (left hi is kept)
    n_lo, n_hi = left.shape[1], right.shape[2]  # the child sides that feed the parent's lo / hi
    for h in range(left.shape[2]):
        target = hi_index(h + half)
        out[1:a_l + 1, :n_lo, target] = np.maximum(out[1:a_l + 1, :n_lo, target], left[1:, :, h])
    # left child empty: the parent's lo is half plus the right's lo (right lo is kept)
    for lo in range(right.shape[1]):
        target = lo_index(half + lo)
        out[1:a_r + 1, target, :n_hi] = np.maximum(out[1:a_r + 1, target, :n_hi], right[1:, lo, :])
    # both non-empty: hi_l + lo_r >= sep, via the suffix max of the right table over its lo
    if a_l and a_r:
        suffix = np.maximum.accumulate(right[1:, ::-1, :], axis=1)[:, ::-1, :]  # [cr-1, j, hi]
        width = left.shape[2]
        need = np.maximum(sep - np.arange(width), 0)
        valid = need < right.shape[1]
        lefts = np.ascontiguousarray(left[1:].transpose(2, 0, 1))[:, :, :, None]  # [h, cl-1, lo, 1]
        scratch = np.empty((a_l, left.shape[1], right.shape[2]), dtype=np.float64)
        for cr in range(1, a_r + 1):
            shifted = np.where(valid[:, None], suffix[cr - 1][np.minimum(need, right.shape[1] - 1)], NEG)  # [h, hi]
            best = np.full((a_l, left.shape[1], right.shape[2]), NEG, dtype=np.float64)
            for h in np.flatnonzero(valid):  # best[cl, lo, hi] = max_h left[cl, lo, h] + shifted[h, hi]
                np.add(lefts[h], shifted[h], out=scratch)
                np.maximum(best, scratch, out=best)
            top = min(a_l, k - cr)
            if top >= 1:
                view = out[cr + 1:cr + top + 1, :n_lo, :n_hi]
                np.maximum(view, best[:top], out=view)
    if completed:
        out += (np.arange(out.shape[0], dtype=np.float64) ** 2)[:, None, None]
    return out


def _exact(k: int, sep: int, n: int) -> int:
    height = max(0, math.ceil(math.log2(n)))

    @functools.lru_cache(maxsize=None)
    def table(h: int, fill: int, need_lo: bool, need_hi: bool) -> np.ndarray:
        if h == 0:
            return _reduce(_leaf(fill == 1, k, sep), need_lo, need_hi)
        half = 2 ** (h - 1)
        lf = min(fill, half)
        left = table(h - 1, lf, need_lo, True)
        right = table(h - 1, fill - lf, True, need_hi)
        d_lo, d_hi = _dims(h, sep, need_lo, need_hi)
        return _combine(left, right, half, sep, _count_cap(fill, k, sep), fill == 2 ** h, d_lo, d_hi)

    root = table(height, n, False, False)
    best = float(root[k].max()) if root.shape[0] > k else NEG
    if not math.isfinite(best):
        raise ConfigError(f"no placement of {k} participations in {n} rounds")
    return int(round(best))


# ---------------------------------------------------------------- per-level bound


def per_level_bound(participations: int, separation: int, rounds: int) -> int:
    """An upper bound on the worst-case ``Σ_I c_I²`` that costs O(log T).

    The completed nodes of one level h are ⌊T/2^h⌋ disjoint intervals of m = 2^h rounds; each holds
    at most a = ⌈m/(s+1)⌉ participations and together at most k. Σ c_I² over the level is then at
    most its value when the participations fill whole nodes greedily (a convex function is largest
    at a vertex): q = min(⌊k/a⌋, ⌊T/m⌋) nodes of a, plus one node of the remainder if a node is left.
    The max of a sum is at most the sum of the per-level maxima. Exact for one participation.
    """
    k, s, n = int(participations), int(separation), int(rounds)
    total = 0
    for h in range(n.bit_length()):
        m, nodes = 2 ** h, n >> h
        if not nodes:
            break
        a = min(k, -(-m // (s + 1)))
        full = min(k // a, nodes)
        rest = min(k - full * a, a) if full < nodes else 0
        total += full * a * a + rest * rest
    return total


# ---------------------------------------------------------------- entry points


def _check(k: int, sep: int, n: int) -> None:
    if k < 1 or n < 1 or sep < 0:
        raise ConfigError(f"need participations >= 1, rounds >= 1, separation >= 0; got {k}, {n}, {sep}")
    if (k - 1) * (sep + 1) + 1 > n:
        raise ConfigError(f"{k} participations at least {sep} rounds apart do not fit in {n} rounds")


def exact_cost(participations: int, separation: int, rounds: int) -> tuple[float, float]:
    """(max-plus additions, bytes) the exact dynamic program needs, estimated before running it."""
    height = max(0, math.ceil(math.log2(rounds)))
    return _cost(height, rounds, participations, separation, False, False, set())


def _too_costly(k: int, sep: int, n: int) -> str | None:
    work, memory = exact_cost(k, sep, n)
    if work > EXACT_WORK_LIMIT:
        return f"~{work:.2g} operations (limit {EXACT_WORK_LIMIT:.2g})"
    if memory > EXACT_MEMORY_LIMIT:
        return f"~{memory / 2**20:.0f} MB of tables (limit {EXACT_MEMORY_LIMIT / 2**20:.0f} MB)"
    return None


@functools.lru_cache(maxsize=256)
def tree_sensitivity(participations: int, separation: int, rounds: int) -> TreeSensitivity:
    """Worst-case ``Σ_I c_I²`` over placements of ``participations`` rounds among ``rounds`` with at
    least ``separation`` rounds strictly between consecutive ones (completed nodes only): exact
    when the dynamic program fits :data:`EXACT_WORK_LIMIT`, else :func:`per_level_bound` (logged)."""
    k, sep, n = int(participations), int(separation), int(rounds)
    _check(k, sep, n)
    too_costly = _too_costly(k, sep, n)
    if too_costly is None:
        return TreeSensitivity(_exact(k, sep, n), "exact", k, sep, n)
    bound = per_level_bound(k, sep, n)
    log.warning("tree sensitivity for %d participations >= %d rounds apart in %d rounds: the exact worst case "
                "needs %s; using the per-level upper bound %d (conservative)", k, sep, n, too_costly, bound)
    return TreeSensitivity(bound, "per-level bound", k, sep, n)


def max_sensitivity_sq(participations: int, separation: int, rounds: int) -> int:
    """The exact worst-case ``Σ_I c_I²`` (see :func:`tree_sensitivity`); raises ConfigError when
    the exact program exceeds :data:`EXACT_WORK_LIMIT`."""
    _check(int(participations), int(separation), int(rounds))
    too_costly = _too_costly(int(participations), int(separation), int(rounds))
    if too_costly is not None:
        raise ConfigError(f"the exact tree sensitivity needs {too_costly}")
    return tree_sensitivity(participations, separation, rounds).sum_sq


def tree_accounting(noise_multiplier: float, rounds: int, participations: int, separation: int,
                    restart_every: int | None = None, planned_rounds: int | None = None,
                    planned_participations: int | None = None) -> tuple[dp_accounting.DpEvent, list[dict]]:
    """The DpEvent of tree-aggregation noise over ``rounds`` rounds (zero-out relation), and per
    tree how its sensitivity was obtained (for privacy.json and the calculator).

    With ``planned_rounds`` > ``rounds`` (a prefix of a run of that length, whose users take part at
    most ``planned_participations`` times) the planned run's worst case is computed once and the
    prefix is bounded by ``min(Σsens²(planned), per-level bound(prefix))``: both are upper bounds of
    the prefix's exact value (a placement within the prefix is one within the run, and the run
    completes every node the prefix does), so per-round epsilon never re-runs the dynamic program.
    """
    sigma = float(noise_multiplier)
    trees = _tree_lengths(rounds, restart_every)
    prefix = bool(planned_rounds) and planned_rounds > rounds
    planned = _tree_lengths(planned_rounds, restart_every) if prefix else trees
    k_planned = planned_participations if prefix and planned_participations else participations
    events, details = [], []
    for i, length in enumerate(trees):
        k = min(participations, -(-length // (separation + 1)))  # at most this many fit in one tree
        if k <= 1:
            events.append(dp_accounting.SingleEpochTreeAggregationDpEvent(sigma, length))
            continue
        full = planned[i]
        if full == length:
            found = tree_sensitivity(k, separation, length)
            sens_sq, method = found.sum_sq, found.method
        else:
            k_full = min(k_planned, -(-full // (separation + 1)))
            found = tree_sensitivity(k_full, separation, full)
            sens_sq = min(found.sum_sq, per_level_bound(k, separation, length))
            method = f"bound for a prefix of {full} rounds ({found.method} for the whole, or per level)"
        events.append(dp_accounting.GaussianDpEvent(sigma / math.sqrt(sens_sq)))
        details.append({"tree_rounds": length, "participations": k, "min_separation": separation,
                        "sum_sensitivity_sq": sens_sq, "method": method})
    return (events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)), details


def _tree_lengths(rounds: int, restart_every: int | None) -> list[int]:
    """Lengths of the trees of a run (restarted every ``restart_every`` rounds)."""
    if not restart_every:
        return [rounds]
    return [restart_every] * (rounds // restart_every) + ([rounds % restart_every] if rounds % restart_every else [])
