"""``plan=auto``'s round-0 public pre-training, planned from public quantities only.

Inputs: the number P of public sentences the run loaded (``data.public_source``, capped by
``data.public_max_sentences``; None when it has no public corpus), whether a teacher is configured
(``public.teacher``: pre-training then distils from it, :mod:`fedpriv.public.setup`) and
``plan.pretrain`` (``auto`` or ``off``). No private example is read, and nothing here changes the
private rounds: their cohort, rounds, mechanism, sampler and σ are chosen exactly as without a public
corpus, so the ledger (privacy.json) is the same with and without pre-training (tested).

The rule. With at least :data:`MIN_PUBLIC_POOL` public sentences, pre-train for
S = min(⌈:data:`PRETRAIN_EPOCHS`·P/B⌉, :data:`MAX_PRETRAIN_STEPS`) SGD steps of B =
:data:`PRETRAIN_BATCH` sentences at rate :data:`PRETRAIN_LR` on the whole pool; then the server step
of the private rounds is planned from the pre-trained start: the largest step whose accumulated
noise a stays at :data:`A_TARGET_PRETRAINED` (a smaller a than from scratch: noise accumulated in a
pre-trained model erases what it learnt from public text, while a random start has nothing to lose;
"Large Language Models Can Be Strong Differentially Private Learners" and "Considerations for
Differentially Private Learning with Large-Scale Public Pretraining" fine-tune with small steps after
public pre-training). The constants were measured on the real-text corpus (docs/PLANNER.md, "Public
pre-training").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional

PRETRAIN_BATCH = 64  # sentences per pre-training step
PRETRAIN_LR = 0.5  # pre-training SGD step size (the measured public_pretrain runs' rate)
PRETRAIN_EPOCHS = 10.0  # passes over the public pool
MAX_PRETRAIN_STEPS = 10_000  # the server's compute on public text: at most this many steps
MIN_PUBLIC_POOL = 1_000  # fewer public sentences: not planned (too little to learn a language from)
# the accumulated noise a the private rounds' server step keeps after a pre-trained start
A_TARGET_PRETRAINED = 0.25


@dataclass(frozen=True)
class PretrainChoice:
    """The planned pre-training: ``steps`` (0: none, ``reason`` says why) of ``batch_size`` public
    sentences at rate ``lr`` over the whole pool of ``pool`` sentences, with distillation when a
    teacher is configured; ``accumulated_noise``: the a the private rounds' step then keeps;
    ``planned``: the plan sets the ``public.*`` pre-training keys (a public corpus, ``plan.pretrain=auto``)."""

    planned: bool
    steps: int
    batch_size: int
    lr: float
    pool: Optional[int]
    epochs: float
    distillation: bool
    accumulated_noise: Optional[float]
    reason: str

    def describe(self) -> dict:
        """The plain values (the plan's ``public`` entry in summary.json and ``--json``)."""
        return asdict(self)

    def settings(self) -> dict:
        """The ``public.*`` values this choice sets (the plan's overrides print them; a setting typed
        beside ``plan=auto`` that contradicts one is refused)."""
        return {"pretrain_steps": self.steps, "pretrain_batch_size": self.batch_size, "pretrain_lr": self.lr,
                "pretrain_fraction": 1.0}


def plan_pretraining(pool: Optional[int], mode: str, teacher: str) -> PretrainChoice:
    """The pre-training of a run whose public corpus holds ``pool`` sentences (None: it has none),
    under ``plan.pretrain=mode`` with ``public.teacher=teacher`` (module docstring)."""
    distill = teacher != "none"
    if mode == "off":
        return _none(False, pool, "plan.pretrain=off: the public.* settings are used as given")
    if pool is None:
        return _none(False, pool, "no public corpus: set data.public_source (and data.public_path) to pre-train on "
                           "public text of the users' language")
    if pool < MIN_PUBLIC_POOL:
        return _none(True, pool, f"the public corpus holds {pool} sentences, fewer than the {MIN_PUBLIC_POOL} planned "
                           "pre-training needs")
    steps = min(MAX_PRETRAIN_STEPS, math.ceil(PRETRAIN_EPOCHS * pool / PRETRAIN_BATCH))
    epochs = steps * PRETRAIN_BATCH / pool
    capped = steps == MAX_PRETRAIN_STEPS and epochs < PRETRAIN_EPOCHS
    reason = (f"{epochs:.3g} epochs over the {pool} public sentences"
              + (f" (capped at {MAX_PRETRAIN_STEPS} steps)" if capped else "")
              + (f", distilling from the public.teacher={teacher} teacher" if distill else "")
              + f"; then the private rounds' step keeps the accumulated noise a at {A_TARGET_PRETRAINED:g} "
                "(a pre-trained start has more to lose to noise); public data only: no privacy cost")
    return PretrainChoice(True, steps, PRETRAIN_BATCH, PRETRAIN_LR, pool, epochs, distill, A_TARGET_PRETRAINED, reason)


def _none(planned: bool, pool: Optional[int], reason: str) -> PretrainChoice:
    return PretrainChoice(planned, 0, PRETRAIN_BATCH, PRETRAIN_LR, pool, 0.0, False, None, reason)
