"""Next-token metrics of a language model on padded sentence rows.

``accuracy`` ignores targets that are pad, OOV or EOS (the StackOverflow convention);
``accuracy_with_specials`` counts every non-pad target (OOV and EOS included). ``loss`` is the
mean cross-entropy over non-pad targets, ``perplexity = exp(loss)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedpriv.text.vocabulary import Vocabulary
from fedpriv.text.tokenizers import next_word_accuracy


def target_logits(model: nn.Module, rows: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and targets at the non-pad target positions of ``rows`` [B, seq_len+1].

    The output layer (vocabulary-sized, most of an LM's compute) runs only where the target is
    not padding. Models expose ``features`` and ``head``; others fall back to a full forward.
    """
    x, y = rows[:, :-1], rows[:, 1:]
    keep = y != pad_id
    if hasattr(model, "features") and hasattr(model, "head"):
        return model.head(model.features(x)[keep]), y[keep]
    return model(x)[keep], y[keep]


def token_loss(model: nn.Module, rows: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Mean next-token cross-entropy over the non-pad targets of a batch of rows."""
    logits, targets = target_logits(model, rows, pad_id)
    return F.cross_entropy(logits, targets)


def sequence_token_losses(model: nn.Module, rows: torch.Tensor, pad_id: int,
                          flat: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the summed next-token cross-entropy over its non-pad targets, and their count ([B] each).

    Batch-first all the way to the output layer (logits ``[B, T, V]``), so per-sample clipping can
    attribute every position to its row. Trailing columns whose targets are all pad are dropped
    first (exact for causal models: no earlier position sees them). ``flat``: the output layer
    runs only on the non-pad targets, as flattened positions the model declares per row
    (``model(x, keep=mask)``, :func:`fedpriv.clipping.flat_positions`); the same losses.
    """
    targets = rows[:, 1:] != pad_id
    width = int(torch.nonzero(targets.any(0)).max()) + 1 if targets.any() else 1
    x, y = rows[:, :width], rows[:, 1:width + 1]
    if flat:
        keep = y != pad_id
        ce = F.cross_entropy(model(x, keep=keep), y[keep], reduction="none")
        return ce.new_zeros(len(rows)).index_add(0, torch.nonzero(keep)[:, 0], ce), keep.sum(dim=1)
    logits = model(x)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=pad_id,
                         reduction="none").view_as(y)
    return ce.sum(dim=1), (y != pad_id).sum(dim=1)


EVAL_ROWS = 256  # rows per evaluation batch, at most
EVAL_LOGITS_BYTES = 64 << 20  # at most this much of float32 logits per evaluation batch


def eval_batch_rows(seq_len: int, vocab_size: int) -> int:
    """Rows per evaluation batch: :data:`EVAL_ROWS`, fewer where a batch's logits (at most
    ``rows · seq_len · vocab_size`` float32, and as much again for the log-softmax) would pass
    :data:`EVAL_LOGITS_BYTES`: evaluation's memory then does not grow with the vocabulary
    (10k words: 83 rows, 64 MB of logits, where 256 rows held 205 MB)."""
    return max(1, min(EVAL_ROWS, EVAL_LOGITS_BYTES // (4 * max(seq_len, 1) * vocab_size)))


@torch.no_grad()
def evaluate(model: nn.Module, rows: np.ndarray, vocab: Vocabulary, batch_size: int | None = None,
             word_of: np.ndarray | None = None) -> dict[str, float]:
    """Accuracy (both variants), loss and perplexity of ``model`` on ``rows`` [N, seq_len+1]; with
    ``word_of`` (the word index of each target, subword tokenizers) also ``word_accuracy``: the
    share of words all of whose tokens are predicted right (:func:`~fedpriv.text.tokenizers.next_word_accuracy`).
    ``batch_size``: rows per batch (None: :func:`eval_batch_rows`)."""
    if batch_size is None:
        batch_size = eval_batch_rows(np.shape(rows)[1] - 1, vocab.size)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    excluded = torch.tensor(vocab.excluded_from_accuracy(), device=device)
    loss_sum = correct = counted = correct_all = counted_all = 0.0
    data = torch.as_tensor(rows, dtype=torch.long, device=device)
    # per-position argmax, kept only when next-word accuracy needs it (-1 at pad targets)
    predicted = (torch.full((len(data), data.shape[1] - 1), -1, dtype=torch.long, device=device)
                 if word_of is not None else None)
    for start in range(0, len(data), batch_size):
        batch = data[start:start + batch_size]
        logits, y = target_logits(model, batch, vocab.pad_id)
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        guess = logits.argmax(-1)
        if predicted is not None:
            predicted[start:start + batch_size][batch[:, 1:] != vocab.pad_id] = guess
        hit = guess == y
        words = ~torch.isin(y, excluded)
        correct += (hit & words).sum().item()
        counted += words.sum().item()
        correct_all += hit.sum().item()
        counted_all += len(y)
    model.train(was_training)
    loss = loss_sum / max(counted_all, 1)
    out = {"accuracy": correct / max(counted, 1), "accuracy_with_specials": correct_all / max(counted_all, 1),
           "loss": loss, "perplexity": math.exp(min(loss, 50.0))}
    if predicted is not None:
        out["word_accuracy"] = next_word_accuracy(predicted.cpu().numpy(), np.asarray(rows), word_of,
                                                  vocab.excluded_from_accuracy())
    return out
