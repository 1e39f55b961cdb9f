"""Degradation caught: whether a finished run's held-out model got worse, why, and what to change.

A run is *degraded* when, on its test-set evaluations (the ``test_loss``/``test_accuracy`` of
metrics.jsonl, which ε already covers):

(a) its final test loss is more than :data:`LOSS_RISE` (5%) above the best test loss, over at least
    :data:`MIN_EVALUATIONS` evaluations (fewer cannot tell a rise from a start);
(b) its final accuracy is below the unigram baseline (always predicting the most frequent public
    word: a model that learnt nothing useful);
(c) its final test loss exceeds ``ln V``, the loss of a uniform guess over the V token ids, and is
    not an untrained model's (which sits near ln V at its best): it diverged; or
(d) its loss fell clearly below ``ln V`` while its accuracy stayed under 1/V — under what always
    predicting the most frequent word gives: the model learnt to predict tokens the accuracy
    leaves out (the unknown token, the end of a sentence).

The cause is a guess from public quantities only (the config, the pre-run noise figure, and the
test split, whose metrics are published): ``vocabulary does not fit the data`` for (d) (with the
share of the test split's targets that are the unknown token); ``server step too large`` when the
server step η·C is above :data:`STABLE_STEP`, the largest measured to train stably without noise
(the accumulated noise a grows with the step, so the noise line's warning does not tell them
apart), or when the loss exploded past ln V without a noise warning; ``noise`` when the pre-run
noise line warned; ``too few steps`` when the accuracy is below the unigram baseline with no
loss rise; else ``cause unknown``. Each names overrides that address it, only those that follow
from the planner's rule (docs/PLANNER.md): ``plan=auto`` (the step for the noise, at least
:data:`~fedpriv.plan.auto.MIN_ROUNDS` rounds), or, for a run of at least that many rounds, the
step the planner would take at this run's noise. No training user's statistic enters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass


from fedpriv.plan.auto import CHOSEN_KEYS, MAX_STEP, MIN_COHORT, MIN_ROUNDS, refusal
from fedpriv.plan.noise_figure import A_TARGET
from fedpriv.plan.run_plan import RunPlan, server_step
from fedpriv.schema import RunConfig

LOSS_RISE = 0.05  # final test loss above (1 + LOSS_RISE) x the best one: degraded
MIN_EVALUATIONS = 3  # evaluations needed before a rise of the loss is judged
# η·C above this is beyond every step measured to train stably without noise (docs/PLANNER.md,
# "Calibration runs": lr·C = 1, 2 and 4 trained on both corpora at σ = 0; nothing larger was run)
STABLE_STEP = 4.0
MIN_PLANNED_UPDATES = MIN_ROUNDS * MIN_COHORT  # the smallest budget plan=auto accepts

NOISE, STEP, TOO_FEW, VOCAB, UNKNOWN = ("noise", "server step too large", "too few steps",
                                        "vocabulary does not fit the data", "cause unknown")


@dataclass(frozen=True)
class RunFacts:
    """The public quantities of a finished run the verdict reads: its config and its pre-run noise
    figure (:func:`run_facts`), and the share of the test split's words that reach the model as
    no known token (the dataset's ``test_unknown_share``, :mod:`fedpriv.data.text_pipeline`)."""

    cohort_size: float = 1.0
    rounds: int = 1
    server_lr: float | None = None  # optimizer.lr (None: the server optimizer has none)
    step: float | None = None  # η·C of a heavy-ball SGD step, as a cosine schedule's peak (None: another optimizer)
    accumulated_noise: float | None = None  # a (fedpriv.plan.noise_figure; None where step is None)
    noise_warned: bool = False  # the pre-run noise line warned
    planned: bool = False  # it ran under plan=auto
    plannable: bool = True  # plan=auto would plan its config (fedpriv.plan.auto.refusal)
    public_population: bool = True  # its population is public (plan=auto can plan it without population=N)
    server_steps: float | None = None  # a planned run's full-size server steps P (its plan's prediction)
    unknown_share: float | None = None  # of the test split's words, the share the model sees as unknown


@dataclass(frozen=True)
class Fix:
    """One suggested change: ``overrides`` to set on the run's command line (in place of the same
    keys) and the keys to ``leave_out`` of it (those ``plan=auto`` chooses), and ``why`` it helps."""

    why: str
    overrides: tuple[str, ...] = ()
    leave_out: tuple[str, ...] = ()

    def text(self) -> str:
        if not self.overrides:
            return self.why
        left = "; leave out the settings it chooses" if self.leave_out else ""
        return f"{' '.join(self.overrides)} ({self.why}{left})"


@dataclass(frozen=True)
class Degradation:
    """The verdict on a degraded run (summary.json's ``degradation`` block)."""

    best_loss: float  # lowest test loss over the evaluations
    best_round: int  # the (1-based) round of that evaluation
    final_loss: float  # test loss after the last round
    rise: float  # final_loss / best_loss - 1
    final_accuracy: float  # the accuracy compared with the unigram baseline
    unigram: float | None  # the unigram baseline's accuracy (None: unknown for this dataset)
    reasons: tuple[str, ...]  # which of "loss rose", "below unigram", "diverged", "accuracy near 0" held
    cause: str
    detail: str  # the evidence for the cause
    fixes: tuple[Fix, ...]  # the alternatives, each addressing the cause
    unknown_share: float | None = None  # of the test split's words, the share the model sees as unknown

    @property
    def fix(self) -> str:
        return ", or ".join(fix.text() for fix in self.fixes)

    def to_dict(self) -> dict:
        return {**asdict(self), "reasons": list(self.reasons), "fix": self.fix}

    def message(self) -> str:
        """The one end-of-run line (without its ``warning:`` prefix)."""
        unigram = "" if self.unigram is None else f" (unigram baseline {self.unigram:.4f})"
        return (f"the model degraded ({', '.join(self.reasons)}): final test loss {self.final_loss:.4g} against "
                f"the best {self.best_loss:.4g} at round {self.best_round} ({self.rise:+.1%}), final accuracy "
                f"{self.final_accuracy:.4f}{unigram}; likely cause: {self.cause} ({self.detail}); fix: {self.fix}")


def _final_accuracy(row: dict) -> float:
    """Next-word accuracy where a subword tokenizer scores words (what the unigram baseline and the
    printed result are), else next-token accuracy."""
    return float(row.get("test_word_accuracy", row["test_accuracy"]))


def run_facts(spec: RunConfig, plan: RunPlan, unknown: float | None = None) -> RunFacts:
    """The :class:`RunFacts` of a run of ``spec`` planned as ``plan``."""
    sgd = server_step(spec)
    choice = plan.choice
    return RunFacts(cohort_size=spec.cohort_size, rounds=spec.rounds, server_lr=getattr(spec.optimizer, "lr", None),
                    step=None if sgd is None else sgd[0] * spec.privacy.clip_norm,
                    accumulated_noise=plan.noise.accumulated, noise_warned=plan.noise.too_noisy,
                    planned=choice is not None, plannable=refusal(spec) is None,
                    public_population=bool(spec.population or spec.data.public_population()),
                    server_steps=None if choice is None else choice["prediction"]["server_steps"],
                    unknown_share=unknown)


def _planner_lr(facts: RunFacts) -> float | None:
    """The server lr at which this run's step is the planner's for its noise: η·C = min(MAX_STEP,
    η·C·A_TARGET/a), so that a = A_TARGET (None: no heavy-ball step, or no noise figure)."""
    if facts.step is None or not facts.server_lr or facts.accumulated_noise is None or facts.step <= 0:
        return None
    target = MAX_STEP if facts.accumulated_noise <= 0 else min(MAX_STEP, facts.step * A_TARGET
                                                               / facts.accumulated_noise)
    return facts.server_lr * target / facts.step


def _fixes(cause: str, facts: RunFacts) -> tuple[Fix, ...]:
    """The alternatives that address ``cause`` at this run's compute (U = cohort_size x rounds, at
    least what plan=auto accepts): plan=auto where it would plan the run (with ``population=N``
    where the run states no public population); the planner's step where the run has at least
    MIN_ROUNDS rounds (fewer: a smaller step leaves too few steps); for a planned run, what raises
    its full-size server steps."""
    if cause == VOCAB:
        return (Fix("a vocabulary that covers the data: a larger data.vocab_size, or a word list (data.vocab_path) "
                    "from public text like the data; a subword tokenizer (data.tokenizer) made for this text and "
                    "model"),)
    if facts.planned:
        steps = "" if facts.server_steps is None else f"its plan made {facts.server_steps:.3g} full-size server steps: "
        return (Fix(f"{steps}a larger privacy.target_epsilon, more users (population) or a larger plan.client_updates "
                    "(python -m fedpriv.plan shows the steps each gives)"),)
    fixes = []
    if facts.plannable:
        budget = max(MIN_PLANNED_UPDATES, round(facts.cohort_size * facts.rounds))
        population = () if facts.public_population else ("population=N",)
        lower = " (a smaller optimizer.lr than this run's)" if cause == STEP else ""
        fixes.append(Fix(f"it sets the step for the noise{lower} and at least {MIN_ROUNDS} rounds"
                         + ("" if facts.public_population else "; N: the public number of users"),
                         ("plan=auto", f"plan.client_updates={budget}", *population), CHOSEN_KEYS))
    long = facts.rounds >= MIN_ROUNDS
    short = "" if long else f"; with at least {MIN_ROUNDS} rounds: fewer are too few steps at a smaller step"
    lr = _planner_lr(facts)
    if cause in (STEP, NOISE) and lr is not None and (long or not fixes):
        fixes.append(Fix(f"the planner's step at this noise: accumulated noise a {A_TARGET:g}, step at most "
                         f"{MAX_STEP:g}{short}", (f"optimizer.lr={lr:.3g}",)))
    elif cause != TOO_FEW and facts.server_lr and (long or not fixes):
        fixes.append(Fix(f"a smaller server step{short}", (f"optimizer.lr={facts.server_lr / 2:.3g}",)))
    elif cause == TOO_FEW and not fixes:
        fixes.append(Fix("more server steps (at a target epsilon each round then gets more noise: check the pre-run "
                         "line's a)", (f"rounds={max(MIN_ROUNDS, 2 * facts.rounds)}",)))
    return tuple(fixes) or (Fix("a smaller server step"),)


def _cause(facts: RunFacts, vocabulary: bool, exploded: bool, below: bool, rose: bool,
           vocab_size: int) -> tuple[str, str]:
    """The likely cause and its evidence (module docstring)."""
    if vocabulary:
        share = ("" if facts.unknown_share is None else
                 f"{facts.unknown_share:.0%} of the test split's words are unknown to the vocabulary or tokenizer; ")
        return VOCAB, (f"{share}the loss fell while the accuracy stayed under 1/V = {1 / vocab_size:.2g}: the model "
                       "predicts tokens the accuracy leaves out: unknown, end of sentence")
    if facts.step is not None and facts.step > STABLE_STEP:
        lr = "" if facts.server_lr is None else f", from optimizer.lr={facts.server_lr:g},"
        return STEP, (f"a server step eta*C of {facts.step:.3g} per round{lr} above {STABLE_STEP:g}, the largest "
                      "measured to train stably without noise")
    if exploded and not facts.noise_warned:
        return STEP, "the test loss exploded past that of a uniform guess without a noise warning"
    if facts.noise_warned:
        a = "" if facts.accumulated_noise is None else f" a = {facts.accumulated_noise:.3g}"
        return NOISE, f"the pre-run line warned: accumulated noise{a}"
    if below and not rose:
        return TOO_FEW, "below the unigram baseline with no loss rise: the model has not learnt enough yet"
    return UNKNOWN, "no noise warning, a step in the measured range"


def degradation(history: Sequence[dict], unigram: float | None, vocab_size: int,
                facts: RunFacts = RunFacts()) -> Degradation | None:
    """The verdict on a run whose metrics rows are ``history`` (rows with ``test_loss`` are its
    evaluations), or None when it did not degrade (or was never evaluated). ``unigram``: the
    unigram baseline's accuracy (None: condition (b) is skipped); ``vocab_size``: V, the model's
    output ids; ``facts``: the run's public quantities (:func:`run_facts`)."""
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
    rose = len(evaluations) >= MIN_EVALUATIONS and not rise <= LOSS_RISE
    # an untrained model sits near ln V: diverged means clearly past it, or past it on a rising loss
    diverged = not final_loss <= uniform and not (final_loss <= (1 + LOSS_RISE) * uniform and rise <= LOSS_RISE)
    below = unigram is not None and final_accuracy < unigram
    # (d): learnt (the loss clearly under a uniform guess's) yet under what the most frequent word gives
    vocabulary = final_loss < (1 - LOSS_RISE) * uniform and final_accuracy < 1.0 / vocab_size
    reasons = tuple(name for name, held in (("loss rose", rose), ("below unigram", below), ("diverged", diverged),
                                            ("accuracy near 0", vocabulary)) if held)
    if not reasons:
        return None
    cause, detail = _cause(facts, vocabulary, diverged, below, rose, vocab_size)
    return Degradation(best_loss=best_loss, best_round=int(best["round"]), final_loss=final_loss, rise=rise,
                       final_accuracy=final_accuracy, unigram=unigram, reasons=reasons, cause=cause, detail=detail,
                       fixes=_fixes(cause, facts), unknown_share=facts.unknown_share)
