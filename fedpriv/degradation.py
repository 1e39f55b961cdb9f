"""Degradation caught: whether a finished run's held-out model got worse, why, and what to change.

A run is *degraded* when, on its test-set evaluations (the ``test_loss``/``test_accuracy`` of
metrics.jsonl, which ε already covers):

(a) its final test loss is more than :data:`LOSS_RISE` (5%) above the best test loss, over at least
    :data:`MIN_EVALUATIONS` evaluations (fewer cannot tell a rise from a start);
(b) its final accuracy is below the unigram baseline (always predicting the most frequent public
    word: a model that learnt nothing useful); or
(c) its final test loss exceeds ``ln V``, the loss of a uniform guess over the V token ids: it
    diverged.

The cause is a guess from public quantities only (the config and the pre-run noise figure):
``noise`` when the pre-run noise line warned, ``unstable step`` when the loss exploded past ln V
without that (more than 5% past it, or past it on a rising loss: an untrained model sits near
it), ``too few steps`` when the accuracy is below the unigram baseline with no loss rise, else
``cause unknown``; each names overrides that address it. No training user's statistic enters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from fedpriv.plan.auto import MIN_COHORT, MIN_ROUNDS

LOSS_RISE = 0.05  # final test loss above (1 + LOSS_RISE) x the best one: degraded
MIN_EVALUATIONS = 3  # evaluations needed before a rise of the loss is judged

NOISE, UNSTABLE, TOO_FEW, UNKNOWN = "noise", "unstable step", "too few steps", "cause unknown"


@dataclass(frozen=True)
class Degradation:
    """The verdict on a degraded run (summary.json's ``degradation`` block)."""

    best_loss: float  # lowest test loss over the evaluations
    best_round: int  # the (1-based) round of that evaluation
    final_loss: float  # test loss after the last round
    rise: float  # final_loss / best_loss - 1
    final_accuracy: float  # the accuracy compared with the unigram baseline
    unigram: float | None  # the unigram baseline's accuracy (None: unknown for this dataset)
    reasons: tuple[str, ...]  # which of "loss rose", "below unigram", "diverged" held
    cause: str
    fix: str

    def to_dict(self) -> dict:
        return {**asdict(self), "reasons": list(self.reasons)}

    def message(self) -> str:
        """The one end-of-run line (without its ``warning:`` prefix)."""
        unigram = "" if self.unigram is None else f" (unigram baseline {self.unigram:.4f})"
        return (f"the model degraded ({', '.join(self.reasons)}): final test loss {self.final_loss:.4g} against "
                f"the best {self.best_loss:.4g} at round {self.best_round} ({self.rise:+.1%}), final accuracy "
                f"{self.final_accuracy:.4f}{unigram}; likely cause: {self.cause}; fix: {self.fix}")


def _final_accuracy(row: dict) -> float:
    """Next-word accuracy where a subword tokenizer scores words (what the unigram baseline and the
    printed result are), else next-token accuracy."""
    return float(row.get("test_word_accuracy", row["test_accuracy"]))


MIN_PLANNED_UPDATES = MIN_ROUNDS * MIN_COHORT  # the smallest budget plan=auto accepts


def _fix(cause: str, cohort_size: float, rounds: int, server_lr: float | None, planned: bool,
         public_population: bool) -> str:
    """Overrides that address ``cause`` at the compute of this run (U = cohort_size x rounds, at
    least what plan=auto accepts); plan=auto is not suggested to a run that used it, and is
    suggested with ``population=N`` where the run states no public population."""
    budget = max(MIN_PLANNED_UPDATES, round(cohort_size * rounds))
    plan = (f"plan=auto plan.client_updates={budget}" + ("" if public_population else " population=N (the public "
                                                                                       "number of users)"))
    cohort = f"a larger cohort (cohort_size={max(2, round(2 * cohort_size))})"
    step = f"a smaller server step (optimizer.lr={server_lr / 2:.3g})" if server_lr else "a smaller server step"
    correlated = "correlated noise (mechanism=bandmf sampling=balls_in_bins privacy.accountant=mc)"
    fixes = {NOISE: [plan, cohort, correlated],
             UNSTABLE: [step, plan],
             TOO_FEW: [plan, f"more server steps (rounds={2 * rounds})"],
             UNKNOWN: [plan, step, cohort]}[cause]
    if planned:
        fixes = [fix for fix in fixes if fix != plan] or [f"a larger budget (plan.client_updates={2 * budget})"]
    return ", or ".join(fixes)


def degradation(history: Sequence[dict], unigram: float | None, vocab_size: int, *, noise_warned: bool = False,
                cohort_size: float = 1.0, rounds: int = 1, server_lr: float | None = None, planned: bool = False,
                public_population: bool = True) -> Degradation | None:
    """The verdict on a run whose metrics rows are ``history`` (rows with ``test_loss`` are its
    evaluations), or None when it did not degrade (or was never evaluated). ``unigram``: the
    unigram baseline's accuracy (None: condition (b) is skipped); ``vocab_size``: V, the model's
    output ids; ``noise_warned``: the pre-run noise figure was above its warning threshold;
    ``cohort_size``, ``rounds``, ``server_lr``: this run's, for the fix's overrides; ``planned``: it
    ran under plan=auto; ``public_population``: its population is public (plan=auto can plan it)."""
    evaluations = [row for row in history if "test_loss" in row]
    if not evaluations:
        return None
    final = evaluations[-1]
    final_loss, final_accuracy = float(final["test_loss"]), _final_accuracy(final)
    finite = [row for row in evaluations if math.isfinite(row["test_loss"])] or [final]
    best = min(finite, key=lambda row: row["test_loss"])
    best_loss = float(best["test_loss"])
    rise = final_loss / best_loss - 1.0 if best_loss > 0 else 0.0
    uniform = math.log(vocab_size)
    diverged = not final_loss <= uniform  # a NaN loss diverged too
    rose = len(evaluations) >= MIN_EVALUATIONS and not rise <= LOSS_RISE
    # an untrained model sits near ln V: exploded means clearly past it, or past it on a rising loss
    exploded = diverged and not (final_loss <= (1 + LOSS_RISE) * uniform and rise <= LOSS_RISE)
    below = unigram is not None and final_accuracy < unigram
    reasons = tuple(name for name, held in (("loss rose", rose), ("below unigram", below), ("diverged", diverged))
                    if held)
    if not reasons:
        return None
    if noise_warned:
        cause = NOISE
    elif exploded:
        cause = UNSTABLE
    elif below and not rose:
        cause = TOO_FEW
    else:
        cause = UNKNOWN
    return Degradation(best_loss=best_loss, best_round=int(best["round"]), final_loss=final_loss, rise=rise,
                       final_accuracy=final_accuracy, unigram=unigram, reasons=reasons, cause=cause,
                       fix=_fix(cause, cohort_size, rounds, server_lr, planned, public_population))
