"""A model's trainable parameters as one flat vector (the server's view of a model): the order is
``model.parameters()`` order, trainable ones only."""

from __future__ import annotations

import torch
from torch import nn


def get_flat_params(model: nn.Module) -> torch.Tensor:
    """All trainable parameters concatenated in ``model.parameters()`` order (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters() if p.requires_grad])


def set_flat_params(model: nn.Module, flat: torch.Tensor) -> None:
    """Inverse of :func:`get_flat_params`; copies ``flat`` into the trainable parameters in place."""
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            if not p.requires_grad:
                continue
            n = p.numel()
            p.copy_(flat[offset:offset + n].view_as(p))
            offset += n
    if offset != flat.numel():
        raise ValueError(f"flat vector has {flat.numel()} entries, model has {offset}")
