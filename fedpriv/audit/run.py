"""The audit's two moments in a run: canaries built before round 1, results after the last."""

from __future__ import annotations

import math
from typing import Any

from fedpriv.audit.canaries import CanarySet
from fedpriv.audit.report import PLOT_FILE, SCORES_FILE, analyse, plot_png, scores_record
from fedpriv.keys.randomness import SECURE
from fedpriv.schema import Audit
from fedpriv.release.rundir import json_text


def build_canaries(audit: Audit, clip_norm: float, dim: int, sampler, randomness) -> CanarySet | None:
    """The run's canaries (``audit.canaries`` > 0, of norm ``clip_norm``: ``privacy.clip_norm``),
    drawn from the run's ``audit`` subkey."""
    if not audit.canaries:
        return None
    return CanarySet(audit.canaries, dim, float(clip_norm), randomness.subkey("audit"), sampler,
                     support=audit.support)


def audit_label(audit: Audit) -> dict[str, Any] | None:
    """What every output of an audited run says from round 1 on (privacy.json's ``audit``, each
    metrics row's ``audit_canaries``, a TensorBoard text): canaries may join every round, so every
    released model carries canary directions. None for a run without an audit."""
    if not audit.canaries:
        return None
    return {"canaries": audit.canaries, "support": audit.support,
            "note": f"audited run: {audit.canaries} canary units, each inserted by a secret coin, may take "
                    "part in every round from round 1, so every released model carries canary directions; the "
                    "epsilon still covers every real user (docs/PRIVACY.md, 'Auditing a run')"}


def finish_audit(canaries: CanarySet, released, audit: Audit, delta: float, epsilon: float,
                 mode: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Score the final model: the summary's ``audit`` block and the files the run writes for it
    (``audit_scores.json``, one line, and ``audit.png``; :mod:`fedpriv.release.run_outputs` writes them).
    ``delta``: ``privacy.delta``; ``epsilon``: the ledger's claim (infinite for a non-private run)."""
    record = scores_record(canaries.scores(released), canaries.coins, float(delta),
                           epsilon if math.isfinite(epsilon) else None, float(audit.confidence),
                           canaries.seconds if mode != SECURE else None, mode)  # no timing in secure mode
    result = analyse(record)
    return result, {SCORES_FILE: (json_text(record) + "\n").encode(), PLOT_FILE: plot_png(record, result)}
