"""Privacy of tree-aggregation noise (DP-FTRL), for a user taking part k times.

A user's contribution to the rounds it takes part in reaches every *completed* dyadic interval
(tree node) of rounds containing one of them; node noise is N(0, σ²C²). With c_I participations
inside node I, the node's sensitivity is c_I·C, so the release is a Gaussian mechanism with
``Σ sens² = Σ_I c_I²`` (units C²): ρ-zCDP with ρ = Σ sens²/(2σ²), i.e. a Gaussian of multiplier
``σ/√(Σ sens²)`` — what :func:`tree_event` hands to dp_accounting. The worst case over placements
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
import itertools
import math

import dp_accounting
import numpy as np

from fedpriv.errors import ConfigError

NEG = -1e18


def _leaf(inside: bool, k: int, cap: int) -> np.ndarray:
    """Table for one leaf: best[c, lo, hi] (lo/hi: free rounds before the first / after the last
    participation inside the node, capped at ``cap``); -inf where impossible."""
    table = np.full((k + 1, cap + 1, cap + 1), NEG)
    table[0, min(1, cap), min(1, cap)] = 0.0
    if inside and k >= 1:
        table[1, 0, 0] = 1.0  # the leaf node itself: c² = 1
    return table


def _combine(left: np.ndarray, right: np.ndarray, half: int, sep: int, inside: bool) -> np.ndarray:
    """Parent table from two children of ``half`` leaves each; adds c² for the parent node when it
    is a completed node (``inside``). Consecutive participations need ≥ ``sep`` free rounds."""
    k = left.shape[0] - 1
    cap = left.shape[1] - 1
    out = np.full_like(left, NEG)
    idx = np.arange(cap + 1)
    # right empty: parent's hi = left's hi + half (capped)
    hi_shift = np.minimum(idx + half, cap)
    for c in range(1, k + 1):
        for h in range(cap + 1):
            out[c, :, hi_shift[h]] = np.maximum(out[c, :, hi_shift[h]], left[c, :, h])
        for lo in range(cap + 1):  # left empty: parent's lo = half + right's lo (capped)
            out[c, hi_shift[lo], :] = np.maximum(out[c, hi_shift[lo], :], right[c, lo, :])
    empty = min(2 * half, cap)
    out[0, empty, empty] = 0.0
    # both non-empty: need hi_l + lo_r >= sep; suffix max of right over lo_r
    suffix = np.maximum.accumulate(right[:, ::-1, :], axis=1)[:, ::-1, :]  # [c, j, hi] = max_{lo>=j}
    need = np.clip(sep - idx, 0, cap)  # for each hi_l, the smallest allowed lo_r
    for cl in range(1, k):
        for cr in range(1, k - cl + 1):
            # best[lo, hi] = max_{hi_l} left[cl, lo, hi_l] + suffix[cr, need[hi_l], hi]
            cand = left[cl][:, :, None] + suffix[cr][need][None, :, :]
            out[cl + cr] = np.maximum(out[cl + cr], cand.max(axis=1))
    if inside:
        counts = np.arange(k + 1, dtype=float) ** 2
        valid = out > NEG / 2
        out = np.where(valid, out + counts[:, None, None], NEG)
    return out


@functools.lru_cache(maxsize=256)
def max_sensitivity_sq(participations: int, separation: int, rounds: int) -> int:
    """Worst-case ``Σ_I c_I²`` over placements of ``participations`` leaves among ``rounds`` with
    at least ``separation`` rounds strictly between consecutive ones (completed nodes only).

    Exact dynamic program over the tree: per subtree, the best value for each (count, free
    rounds before the first participation, after the last), gaps capped at ``separation``.
    Cost O(log T · k² · s³) with s = min(separation, T).
    """
    k, sep, n = int(participations), int(separation), int(rounds)
    if k < 1 or n < 1 or sep < 0:
        raise ConfigError(f"need participations >= 1, rounds >= 1, separation >= 0; got {k}, {n}, {sep}")
    if (k - 1) * (sep + 1) + 1 > n:
        raise ConfigError(f"{k} participations at least {sep} rounds apart do not fit in {n} rounds")
    cap = min(sep, n)
    height = max(0, math.ceil(math.log2(n)))
    level = [_leaf(i < n, k, cap) for i in range(2 ** height)]
    size = 1
    while len(level) > 1:
        nxt = []
        for j in range(0, len(level), 2):
            start = j * size
            inside = start + 2 * size <= n  # a node is released once all its rounds happened
            nxt.append(_combine(level[j], level[j + 1], size, sep, inside))
        level, size = nxt, size * 2
    best = level[0][k].max()
    if best < NEG / 2:
        raise ConfigError(f"no placement of {k} participations in {n} rounds")
    return int(round(best))


def brute_force_sensitivity_sq(participations: int, separation: int, rounds: int) -> int:
    """The same worst case by enumerating placements (small cases; for tests)."""
    nodes = [(s, s + 2 ** h) for h in range(rounds.bit_length()) for s in range(0, rounds, 2 ** h)
             if s + 2 ** h <= rounds]
    best = 0
    for places in itertools.combinations(range(rounds), participations):
        if any(b - a - 1 < separation for a, b in zip(places, places[1:])):
            continue
        total = sum(sum(lo <= p < hi for p in places) ** 2 for lo, hi in nodes)
        best = max(best, total)
    return best


def tree_event(noise_multiplier: float, rounds: int, participations: int, separation: int,
               restart_every: int | None = None) -> dp_accounting.DpEvent:
    """The DpEvent of tree-aggregation noise over ``rounds`` rounds (zero-out relation)."""
    sigma = float(noise_multiplier)
    trees = [restart_every] * (rounds // restart_every) if restart_every else [rounds]
    if restart_every and rounds % restart_every:
        trees.append(rounds % restart_every)
    events = []
    for length in trees:
        k = min(participations, -(-length // (separation + 1)))  # at most this many fit in one tree
        if k <= 1:
            events.append(dp_accounting.SingleEpochTreeAggregationDpEvent(sigma, length))
        else:
            sens_sq = max_sensitivity_sq(k, separation, length)
            events.append(dp_accounting.GaussianDpEvent(sigma / math.sqrt(sens_sq)))
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)
