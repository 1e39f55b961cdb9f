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

from fedpriv.data.federated import Vocabulary


def token_loss(logits: torch.Tensor, targets: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Mean cross-entropy over non-pad targets of a batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=pad_id)


@torch.no_grad()
def evaluate(model: nn.Module, rows: np.ndarray, vocab: Vocabulary, batch_size: int = 256) -> dict[str, float]:
    """Accuracy (both variants), loss and perplexity of ``model`` on ``rows`` [N, seq_len+1]."""
    was_training = model.training
    model.eval()
    excluded = torch.tensor(vocab.excluded_from_accuracy())
    loss_sum = correct = counted = correct_all = counted_all = 0.0
    data = torch.as_tensor(rows, dtype=torch.long)
    for start in range(0, len(data), batch_size):
        batch = data[start:start + batch_size]
        x, y = batch[:, :-1], batch[:, 1:]
        logits = model(x)
        nonpad = y != vocab.pad_id
        loss_sum += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                    ignore_index=vocab.pad_id, reduction="sum").item()
        hit = logits.argmax(-1) == y
        words = ~torch.isin(y, excluded)
        correct += (hit & words).sum().item()
        counted += words.sum().item()
        correct_all += (hit & nonpad).sum().item()
        counted_all += nonpad.sum().item()
    model.train(was_training)
    loss = loss_sum / max(counted_all, 1)
    return {"accuracy": correct / max(counted, 1), "accuracy_with_specials": correct_all / max(counted_all, 1),
            "loss": loss, "perplexity": math.exp(min(loss, 50.0))}
