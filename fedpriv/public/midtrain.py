"""Distribution-matching mid-training: after round T' of private training, select the public
samples that look private and train on them, then resume private training on the same ledger.

Scores (``public.mid_training_score``), p_priv the released DP model at T', p_pub the public
teacher, log p(x) summed over x's tokens:

* ``ratio`` (default): ``log p_priv(x) − log p_pub(x)``, the density ratio: samples the private
  model likes *more than* the public distribution does;
* ``sum``: ``log p_priv(x) + log p_pub(x)`` (the issue's formula; measured worse than random
  selection on the synthetic default: it rewards short, generic public sentences);
* ``private``: ``log p_priv(x)`` only (ablation; no teacher needed).

Keep the top ``fraction`` of the public pool; run :func:`~fedpriv.public.pretrain.pretrain` on them
(with distillation when a teacher's top-k corpus exists). Inputs are a DP release and public data
only, so this is post-processing: the ledger is exactly that of the private rounds (tested).
"""

from __future__ import annotations

from typing import Any

import torch

from fedpriv.errors import ConfigError
from fedpriv.models import set_flat_params
from fedpriv.public.distill import TopKSubset
from fedpriv.public.matching import matching_stats, select_top, sequence_logprob
from fedpriv.public.pretrain import pretrain
from fedpriv.schema import Public

def check_mid_training(public: Public, rounds: int) -> int | None:
    """The mid-training round T' (after T' rounds), validated; None when off; ``"half"``: T // 2."""
    at = public.mid_training_round
    if at is None:
        return None
    if at == "half":
        at = rounds // 2
    if not 1 <= at < rounds:
        raise ConfigError(f"public.mid_training_round must be 'half' or an integer in [1, rounds-1={rounds - 1}], "
                          f"got {at!r}")
    if public.mid_training_score != "private" and public.teacher == "none":
        raise ConfigError(f"public.mid_training_score={public.mid_training_score} needs a public teacher "
                          "(public.teacher=embedded); use mid_training_score=private for the p_priv-only ablation")
    return at


def mid_train(task, public, params: torch.Tensor, settings: Public, seed: int) -> tuple[torch.Tensor, dict]:
    """Select public samples by score and train ``params`` on them; returns (params, stats).
    ``public`` holds the run's teacher and its top-k corpus (:class:`~fedpriv.public.setup.PublicArtifacts`);
    ``settings``: the run's typed ``public`` section."""
    pool = task.data.public
    if pool is None:
        raise ConfigError(f"mid-training needs a public corpus; dataset {task.data.name!r} has none")
    pad = task.data.vocab.pad_id
    model = task.eval_model
    set_flat_params(model, params)
    score = sequence_logprob(model, pool.sentences, pad)
    kind = settings.mid_training_score
    if kind != "private":
        sign = -1.0 if kind == "ratio" else 1.0
        score = score + sign * sequence_logprob(public.teacher, pool.sentences, pad)
    selected = select_top(score, settings.mid_training_fraction)
    stats: dict[str, Any] = {"selected": float(len(selected)), "score": settings.mid_training_score}
    if pool.topics is not None:
        stats.update(matching_stats(selected, pool.topics, pool.private_topics))
    topk = TopKSubset(public.topk, selected) if public.topk is not None else None
    new_params, train_stats = pretrain(model, pool.sentences[selected], settings.mid_training_steps,
                                       settings.pretrain_batch_size,
                                       settings.mid_training_lr, seed + 1, pad, topk=topk,
                                       beta=settings.distill_beta,
                                       temperature=settings.distill_temperature)
    stats.update({"public_sentences_used": train_stats["public_sentences_used"]})
    return new_params, stats
