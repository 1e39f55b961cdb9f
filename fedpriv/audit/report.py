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
from pathlib import Path
from typing import Any

import numpy as np

from fedpriv.audit.bound import one_run_audit
from fedpriv.audit.estimate import estimate_epsilon
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
    return {"canaries": m, "guesses": bound.guesses, "correct": bound.correct,
            "epsilon_lower_bound": bound.epsilon_lower_bound,
            "epsilon_estimate": estimates[top]["epsilon_estimate"] if top else None,
            "confidence": confidence, "claimed_epsilon": record["claimed_epsilon"], "delta": record["delta"],
            "bound_score": bound.score, "estimate_score": top, "hypotheses": bound.hypotheses,
            "inserted": int(coins.sum()), "estimates": estimates,
            "audit_seconds": record.get("audit_seconds")}


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


def headline(result: dict[str, Any]) -> str:
    """One line for people: the claim beside the bound and the estimate."""
    claimed = result["claimed_epsilon"]
    claim = "inf (non-private)" if claimed is None else f"{claimed:.4g}"
    estimate = ("none (fewer than 2 canaries inserted)" if result["epsilon_estimate"] is None
                else f"{result['epsilon_estimate']:.4g} ({result['estimate_score']})")
    return (f"audit: claimed epsilon {claim} at delta {result['delta']:g}; one-run lower bound "
            f"{result['epsilon_lower_bound']:.4g} ({result['confidence']:.0%} confidence, {result['correct']} of "
            f"{result['guesses']} guesses right on {result['bound_score']} scores, {result['canaries']} canaries, "
            f"{result['inserted']} inserted); Gaussian-fit estimate {estimate}")


def plot_png(record: dict[str, Any], result: dict[str, Any]) -> bytes:
    """PNG bytes of the histograms of inserted vs never-inserted scores per score kind; the claim and both numbers
    in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    coins = np.asarray(record["coins"], dtype=bool)
    fig, axes = plt.subplots(1, len(SCORE_KINDS), figsize=(10, 3.8))
    for ax, kind in zip(axes, SCORE_KINDS):
        inserted, never = _groups(np.asarray(record["scores"][kind]), coins)
        edges = np.histogram_bin_edges(np.concatenate([inserted, never]), bins=40)
        ax.hist(never, bins=edges, alpha=0.6, density=True, label=f"never inserted ({never.size})")
        ax.hist(inserted, bins=edges, alpha=0.6, density=True, label=f"inserted ({inserted.size})")
        ax.set_xlabel(f"cosine ({kind.replace('_', ' ')})")
        ax.legend(fontsize=8)
    claimed = result["claimed_epsilon"]
    claim = "∞" if claimed is None or not math.isfinite(claimed) else f"{claimed:.3g}"
    estimate = "none" if result["epsilon_estimate"] is None else f"{result['epsilon_estimate']:.3g}"
    fig.suptitle(f"claimed ε = {claim} (δ = {result['delta']:g});  one-run lower bound "
                 f"{result['epsilon_lower_bound']:.3g} ({result['confidence']:.0%});  Gaussian-fit estimate "
                 f"{estimate}", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
