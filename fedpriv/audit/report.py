"""An audit's saved scores and what they show: ``audit_scores.json``, the summary's ``audit``
block and ``audit.png``.

``audit_scores.json`` (written once, after the last round) holds everything the statistics need
and nothing that regenerates canary material: the coins of the ``M`` coin canaries, both scores
of all ``2M`` canaries (coin canaries first, then the never-inserted ones), δ, the claimed ε and
the confidence. ``python -m fedpriv.audit RUN_DIR`` recomputes the result from it.

What the run releases covers all of it: scores are functions of released updates and of canary
directions, which are independent of the training data (docs/PRIVACY.md).
"""

from __future__ import annotations

import io
import json
import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from fedpriv.audit.bound import (SEARCH_LIMIT, audit_level, best_case_p_value, can_certify, certifiable_ceiling,
                                 certifiable_counts, correct_needed, guess_grid, largest_certifiable_delta,
                                 likely_inserted, one_run_audit, ranked_hits)
from fedpriv.audit.estimate import EPS_MAX, estimate_epsilon
from fedpriv.errors import ConfigError, DamagedFileError

SCORES_FILE = "audit_scores.json"
PLOT_FILE = "audit.png"
FORMAT = 1
SCORE_KINDS = ("max_round", "final")


def scores_record(scores: dict[str, np.ndarray], coins: np.ndarray, delta: float, claimed_epsilon: float | None,
                  confidence: float, seconds: float | None, mode: str) -> dict[str, Any]:
    """The content of ``audit_scores.json``."""
    return {"format": FORMAT, "canaries": int(coins.size), "delta": float(delta),
            "claimed_epsilon": claimed_epsilon, "confidence": float(confidence), "mode": mode,
            "audit_seconds": None if seconds is None else float(seconds), "coins": [int(c) for c in coins],
            "scores": {k: [float(x) for x in scores[k]] for k in SCORE_KINDS}}


def analyse(record: dict[str, Any], confidence: float | None = None) -> dict[str, Any]:
    """The summary's ``audit`` block from a scores record: the one-run lower bound (best score and
    guess count, Bonferroni-corrected over every pair tried) and the Gaussian-fit estimate of
    each score (headline: the larger)."""
    m = record["canaries"]
    coins = np.asarray(record["coins"], dtype=bool)
    confidence = record["confidence"] if confidence is None else confidence
    scores = {k: np.asarray(v, dtype=np.float64) for k, v in record["scores"].items()}
    bound = one_run_audit({k: scores[k][:m] for k in SCORE_KINDS}, coins, record["delta"], confidence)
    estimates = {}
    for kind in SCORE_KINDS:
        inserted, never = _groups(scores[kind], coins)
        # fewer than two inserted canaries (a few canaries, unlucky coins): no fit, the bound still stands
        estimates[kind] = estimate_epsilon(inserted, never, record["delta"]) if inserted.size >= 2 else None
    fitted = [k for k in SCORE_KINDS if estimates[k] is not None]
    top = max(fitted, key=lambda k: estimates[k]["epsilon_estimate"]) if fitted else None
    reason = zero_bound_reason(m, record["delta"], confidence, bound.epsilon_lower_bound, int(coins.sum()),
                               _top_hits({k: scores[k][:m] for k in SCORE_KINDS}, coins), len(SCORE_KINDS))
    return {"canaries": m, "guesses": bound.guesses, "correct": bound.correct,
            "epsilon_lower_bound": bound.epsilon_lower_bound,
            "epsilon_estimate": estimates[top]["epsilon_estimate"] if top else None,
            "epsilon_estimate_saturated": bool(top) and estimates[top]["epsilon_estimate"] >= EPS_MAX,
            "confidence": confidence, "claimed_epsilon": record["claimed_epsilon"], "delta": record["delta"],
            "bound_score": bound.score, "estimate_score": top, "hypotheses": bound.hypotheses,
            "inserted": int(coins.sum()), "estimates": estimates,
            "audit_seconds": record.get("audit_seconds"), "zero_bound_reason": reason}


def _top_hits(scores: dict[str, np.ndarray], coins: np.ndarray) -> dict[int, int]:
    """For each guess count k of the grid: the most inserted canaries among the top k of any score
    (ranked as :func:`one_run_audit` ranks them)."""
    m = coins.size
    best: dict[int, int] = {}
    for values in scores.values():
        hits = ranked_hits(values, coins)
        for k in guess_grid(m):
            best[k] = max(best.get(k, 0), int(hits[k - 1]))
    return best


def _down2(x: float) -> float:
    """``x`` rounded down to two significant digits (so a certifiable δ stays certifiable)."""
    scale = 10.0 ** (math.floor(math.log10(x)) - 1)
    return math.floor(x / scale) * scale


def zero_bound_reason(m: int, delta: float, confidence: float, epsilon_lower_bound: float,
                      inserted: int | None = None, top_hits: dict[int, int] | None = None,
                      scores: int = len(SCORE_KINDS)) -> str | None:
    """Why a one-run bound is 0 and what would let it be positive; None when it is positive.

    Either no guess set could certify ε > 0 at (m, δ, confidence) even for scores that rank every
    inserted canary first (``inserted``: the run's count; default: likely_inserted) — too few canaries, or
    the bound's 2mδ term — and the fix is a smaller δ or another canary count, found with
    :mod:`fedpriv.audit.bound`'s own p-value; or the scores did not separate inserted from
    never-inserted canaries well enough (``top_hits``: per guess count k, the most inserted
    canaries among the top k of any score)."""
    if epsilon_lower_bound > 0:
        return None
    inserted = likely_inserted(m) if inserted is None else inserted
    level = audit_level(m, confidence, scores)
    pairs = len(guess_grid(m)) * scores
    test = f"the {level:.3g} each of the {pairs} (score, guess count) tests must reach for {confidence:.0%} confidence"
    if not can_certify(m, delta, confidence, scores, inserted):
        floor, k = best_case_p_value(m, delta, inserted)
        at = f"at {floor:.3g} or more" if floor < 1 else "at 1 for every guess set"
        best = (f"even if a score ranked all {inserted} inserted canaries first (best case: {min(k, inserted)} of "
                f"{k} guess{'' if k == 1 else 'es'} right)")
        if not can_certify(m, 0.0, confidence, scores, inserted):
            why = (f"no guess set can certify epsilon > 0: with m = {m} canaries ({inserted} inserted) the p-value of "
                   f"epsilon = 0 stays {at} at delta = {delta:g} {best}, above {test} (too few "
                   f"canaries)")
        else:
            why = (f"no guess set can certify epsilon > 0: with m = {m} canaries at delta = {delta:g} the bound's "
                   f"2·m·delta = {2 * m * delta:.3g} term keeps the p-value of epsilon = 0 {at} "
                   f"{best}, above {test}")
        return f"{why}. For a positive bound: {_fixes(m, delta, confidence, scores)}"
    needs = {k: n for k in guess_grid(m) if (n := correct_needed(m, k, delta, level)) is not None
             and n <= inserted}
    if not needs:  # cannot happen when can_certify holds; kept for safety
        return f"no guess set rejected epsilon = 0 at {confidence:.0%} confidence"
    k = min(needs, key=lambda g: (needs[g] / g, -g))
    seen = "" if top_hits is None else f", and the best score had {top_hits[k]} there"
    return (f"the scores did not separate inserted from never-inserted canaries enough to reject epsilon = 0 at "
            f"{confidence:.0%} confidence: a positive bound needs at least {needs[k]} inserted canaries among the "
            f"top {k} of a score{seen} (an honest run with enough noise often gives a zero bound)")


def _fixes(m: int, delta: float, confidence: float, scores: int) -> str:
    """What to change so that a rerun (its coins drawn afresh) can give a positive bound: the largest
    δ for ``m`` canaries, another canary count at this δ, else a count with its largest δ."""
    fixes = []
    most_delta = largest_certifiable_delta(m, confidence, scores)
    if most_delta is not None and most_delta > 0:
        fixes.append(f"lower privacy.delta (the audit's delta is the run's) to at most {_down2(most_delta):.2g}")
    ceiling = certifiable_ceiling(delta, confidence, scores)  # no count from here on can
    top = min(SEARCH_LIMIT, ceiling - 1 if ceiling is not None else SEARCH_LIMIT)
    ok = certifiable_counts(delta, max(top, m - 1), confidence, scores) if top >= 2 else np.zeros(1, dtype=bool)
    fewer = np.flatnonzero(ok[:m])
    more = np.flatnonzero(ok[m + 1:top + 1]) + m + 1 if top > m else np.zeros(0, dtype=int)
    if fewer.size:
        fixes.append(f"use audit.canaries={int(fewer[-1])} (the largest count below {m} that can give a positive "
                     f"bound at delta = {delta:g})")
    elif more.size:
        fixes.append(f"use at least audit.canaries={int(more[0])} (the smallest count above {m} that can give a "
                     f"positive bound at delta = {delta:g})")
    note = ""
    if not fewer.size and not more.size:
        searched = ("no canary count can" if ceiling is not None and ceiling - 1 <= SEARCH_LIMIT
                    else f"no canary count up to {SEARCH_LIMIT} can")
        note = f"; changing audit.canaries alone does not help ({searched} give a positive bound at delta = {delta:g})"
        if most_delta is None:
            count = max(m, 1000)
            fixes.append(f"use e.g. audit.canaries={count} with privacy.delta at most "
                         f"{_down2(largest_certifiable_delta(count, confidence, scores)):.2g}")
    return (", or ".join(fixes) + " (counted for scores that rank every inserted canary first, with the coins "
            "inserting as many canaries as they do in 95% of draws)" + note)


def _groups(values: np.ndarray, coins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(inserted: coin canaries with coin 1; never inserted: coin 0 and the null canaries)."""
    m = coins.size
    return values[:m][coins], np.concatenate([values[:m][~coins], values[m:]])


def read_scores(run_dir: str | Path) -> dict[str, Any]:
    """``RUN_DIR/audit_scores.json``, checked (ConfigError: missing; DamagedFileError: malformed)."""
    path = Path(run_dir) / SCORES_FILE
    if not path.is_file():
        raise ConfigError(f"{path} does not exist (was the run audited? audit.canaries=M)")
    try:
        record = json.loads(path.read_text())
        m = int(record["canaries"])
        ok = (record.get("format") == FORMAT and len(record["coins"]) == m and m >= 2
              and all(len(record["scores"][k]) == 2 * m for k in SCORE_KINDS)
              and 0 < float(record["delta"]) < 1 and 0 < float(record["confidence"]) < 1)
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise DamagedFileError(f"{path} is not an audit scores file of this format")
    return record


def estimate_text(estimate: float | None, digits: int = 4, score: str | None = None) -> str:
    """The Gaussian-fit estimate as printed, with the ``score`` it came from: at the search's
    ceiling it is a bound, ``>= 100 (saturated)``, never a value; ``none`` when there was no fit."""
    if estimate is None:
        return "none"
    saturated = estimate >= EPS_MAX
    notes = [n for n in (score, "saturated" if saturated else None) if n]
    value = f">= {EPS_MAX:g}" if saturated else f"{estimate:.{digits}g}"
    return value + (f" ({', '.join(notes)})" if notes else "")


def headline(result: dict[str, Any]) -> str:
    """One line for people: the claim beside the bound and the estimate."""
    claimed = result["claimed_epsilon"]
    claim = "inf (non-private)" if claimed is None else f"{claimed:.4g}"
    estimate = ("none (fewer than 2 canaries inserted)" if result["epsilon_estimate"] is None
                else estimate_text(result["epsilon_estimate"], score=result["estimate_score"]))
    reason = result.get("zero_bound_reason")
    guesses = ("no guess set rejected epsilon = 0" if reason else
               f"{result['correct']} of {result['guesses']} guesses right on {result['bound_score']} scores")
    return (f"audit: claimed epsilon {claim} at delta {result['delta']:g}; one-run lower bound "
            f"{result['epsilon_lower_bound']:.4g} ({result['confidence']:.0%} confidence, {guesses}, "
            f"{result['canaries']} canaries, {result['inserted']} inserted); Gaussian-fit estimate {estimate}"
            + (f". Lower bound 0: {reason}" if reason else ""))


def audit_figure(record: dict[str, Any], result: dict[str, Any]):
    """The matplotlib Figure of ``audit.png``: histograms (densities) of inserted vs never-inserted
    scores per score kind; the claim and both numbers in the title, and why a zero bound is zero."""
    import matplotlib  # lazy: matplotlib (~0.6 s), only for a figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after matplotlib.use("Agg"); only for a figure

    coins = np.asarray(record["coins"], dtype=bool)
    reason = result.get("zero_bound_reason")
    fig, axes = plt.subplots(1, len(SCORE_KINDS), figsize=(10, 4.6 if reason else 3.8))
    for ax, kind in zip(axes, SCORE_KINDS):
        inserted, never = _groups(np.asarray(record["scores"][kind]), coins)
        edges = np.histogram_bin_edges(np.concatenate([inserted, never]), bins=40)
        ax.hist(never, bins=edges, alpha=0.6, density=True, label=f"never inserted ({never.size})")
        ax.hist(inserted, bins=edges, alpha=0.6, density=True, label=f"inserted ({inserted.size})")
        ax.set_xlabel(f"cosine ({kind.replace('_', ' ')})")
        ax.set_ylabel("density (fraction of canaries per unit cosine)", fontsize=8)
        ax.legend(fontsize=8)
    claimed = result["claimed_epsilon"]
    claim = "∞" if claimed is None or not math.isfinite(claimed) else f"{claimed:.3g}"
    estimate = estimate_text(result["epsilon_estimate"], digits=3)
    title = (f"claimed ε = {claim} (δ = {result['delta']:g});  one-run lower bound "
             f"{result['epsilon_lower_bound']:.3g} ({result['confidence']:.0%});  Gaussian-fit estimate {estimate}")
    if reason:
        title += "\n" + textwrap.fill(f"lower bound 0: {reason}", width=150)
    fig.suptitle(title, fontsize=10 if not reason else 8)
    fig.tight_layout()
    return fig


def plot_png(record: dict[str, Any], result: dict[str, Any]) -> bytes:
    """PNG bytes of :func:`audit_figure`."""
    import matplotlib.pyplot as plt  # lazy: after matplotlib.use("Agg"); only for a figure

    fig = audit_figure(record, result)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
