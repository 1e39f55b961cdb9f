"""Public pre-training (round 0): ordinary (non-private) SGD on public sentences before any
private round. It reads no private data, so it costs no privacy: the run's ledger is exactly the
ledger of the same private rounds from a random start (tested)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedpriv.metrics import token_loss
from fedpriv.models import get_flat_params
from fedpriv.public.distill import TopKCorpus, distillation_loss


def pretrain(model: nn.Module, sentences: np.ndarray, steps: int, batch_size: int, lr: float, seed: int,
             pad_id: int = 0, topk: TopKCorpus | None = None, beta: float = 1.0,
             temperature: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
    """``steps`` minibatch SGD steps on ``sentences`` (rows [P, L]) in place; returns the flat
    parameters and {"public_sentences_used", "public_loss_first", "public_loss_last"}. With
    ``topk`` (the teacher's top-k logits for the same rows) the loss is
    :func:`~fedpriv.public.distill.distillation_loss`."""
    data = torch.as_tensor(sentences, dtype=torch.long)
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, 11]).generate_state(1)[0]))
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    used: set[int] = set()
    losses: list[float] = []
    order = torch.randperm(len(data), generator=gen)
    cursor = 0
    for _ in range(steps):
        if cursor + batch_size > len(order):
            order, cursor = torch.randperm(len(data), generator=gen), 0
        idx = order[cursor:cursor + batch_size]
        cursor += batch_size
        used.update(idx.tolist())
        opt.zero_grad(set_to_none=True)
        batch = data[idx]
        if topk is None:
            loss = token_loss(model, batch, pad_id)
        else:
            ids, values = topk.get(idx.numpy())
            loss = distillation_loss(model(batch[:, :-1]), batch[:, 1:], ids, values, beta, temperature, pad_id)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return get_flat_params(model), {"public_sentences_used": float(len(used)),
                                    "public_loss_first": losses[0] if losses else float("nan"),
                                    "public_loss_last": float(np.mean(losses[-10:])) if losses else float("nan")}
