"""Distribution matching: pick the public samples that look like the private distribution.

``score(x) = log p_priv(x) + log p_pub(x)`` (the DP checkpoint and the public teacher; the
``p_priv``-only ablation drops the second term), ``log p(x)`` the summed next-token log-probability
over x's non-pad targets. The top ``fraction`` of the public pool by score is kept. Scoring uses
only a released (DP) model and public data: post-processing, no privacy cost.

On synthetic data every public sample carries its hidden topic, so selection quality is
measurable: ``precision`` = share of selected samples whose topic private users draw from,
``base_rate`` = that share in the whole pool.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from fedpriv.errors import ConfigError
from fedpriv.metrics import sequence_token_losses


@torch.no_grad()
def sequence_logprob(model: nn.Module, rows: np.ndarray, pad_id: int = 0, batch_size: int = 512) -> np.ndarray:
    """``log p(x)`` per row [N]: minus the summed cross-entropy of every non-pad target."""
    was_training = model.training
    model.eval()
    data = torch.as_tensor(rows, dtype=torch.long)
    out = [-sequence_token_losses(model, data[start:start + batch_size], pad_id)[0].numpy()
           for start in range(0, len(data), batch_size)]
    model.train(was_training)
    return np.concatenate(out) if out else np.zeros(0)


def select_top(scores: np.ndarray, fraction: float) -> np.ndarray:
    """Indices of the ``ceil(fraction·N)`` highest scores (ties broken by index), sorted."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"selection fraction must be in (0, 1], got {fraction}")
    count = int(np.ceil(fraction * len(scores)))
    order = np.lexsort((np.arange(len(scores)), -np.asarray(scores)))
    return np.sort(order[:count])


def matching_stats(selected: np.ndarray, topics: np.ndarray, private_topics: Iterable[int]) -> dict[str, float]:
    """``{"selected", "precision", "base_rate"}`` of a selection on a topic-labelled pool."""
    in_private = np.isin(topics, list(private_topics))
    return {"selected": float(len(selected)),
            "precision": float(in_private[selected].mean()) if len(selected) else 0.0,
            "base_rate": float(in_private.mean()) if len(topics) else 0.0}
