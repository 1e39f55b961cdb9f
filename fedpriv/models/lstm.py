"""LSTM built from ``nn.Linear`` pieces, and the StackOverflow LSTM language model.

Gate order (input, forget, cell, output) and the equations match ``torch.nn.LSTM``::

    [i, f, g, o] = W_ih x_t + b + W_hh h_{t-1}
    c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(g),   h_t = σ(o) ⊙ tanh(c_t)

One bias vector (as Keras/TFF); ``nn.LSTM``'s two biases are equivalent to their sum. Because
both weight matrices are ``nn.Linear`` modules, per-sample clipping hooks see every weight. When
no hook needs the per-step Linear calls (``unrolled=False``, the default) the forward uses
PyTorch's fused LSTM kernel on the very same parameters, which is numerically the same
function and much faster.

Importing this module registers :class:`LSTM` with :mod:`fedpriv.clipping`: a rule with no
parameters of its own (``ih``/``hh`` are clipped by the ``nn.Linear`` rule) whose ``prepare``
step sets ``unrolled=True`` while an engine is attached, so every gate call is a hooked call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
from torch import nn

from fedpriv.clipping import LayerRule, no_contributions, register_hint, register_rule
from fedpriv.schema import ModelOption, positive, register_option


class LSTM(nn.Module):
    """Drop-in for ``nn.LSTM(input_size, hidden_size, num_layers=1, batch_first=True)``.

    Arguments in ``nn.LSTM``'s order. ``num_layers`` and ``batch_first`` accept only the values
    above (one layer; input ``[B, T, input_size]``); any other value raises ``ValueError``.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = True) -> None:
        super().__init__()
        if isinstance(num_layers, bool) or num_layers != 1:
            raise ValueError(f"fedpriv.models.LSTM supports only num_layers=1, got num_layers={num_layers!r}; "
                             "stack several LSTM modules for a deeper network")
        if batch_first is not True:
            raise ValueError(f"fedpriv.models.LSTM supports only batch_first=True (input [B, T, input_size]), "
                             f"got batch_first={batch_first!r}; transpose the input to batch-first")
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = 1
        self.batch_first = True
        self.ih = nn.Linear(input_size, 4 * hidden_size, bias=bias)
        self.hh = nn.Linear(hidden_size, 4 * hidden_size, bias=False)
        self.unrolled = False  # set True by engines that must see each Linear call

    def forward(self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``x``: [B, T, input_size] → (output [B, T, H], (h [1, B, H], c [1, B, H]))."""
        if not self.unrolled:
            if hx is None:
                zeros = x.new_zeros(1, x.shape[0], self.hidden_size)
                hx = (zeros, zeros)
            return self._fused(x, hx)
        return self._unrolled(x, hx)

    def _fused(self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor]):
        bias = self.ih.bias
        if bias is None:
            weights = [self.ih.weight, self.hh.weight]
        else:
            weights = [self.ih.weight, self.hh.weight, bias, torch.zeros_like(bias)]
        out, h, c = torch.lstm(x, hx, weights, bias is not None, 1, 0.0, self.training, False, True)
        return out, (h, c)

    def _unrolled(self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None):
        """Step by step. A zero initial state (``hx=None``) skips step 0's ``hh`` call: it has no
        bias, so ``hh(0) = 0`` and its weight's gradient from that step is 0 — the same function,
        and no batch-sized constant for per-sample clipping to puzzle over."""
        h, c = (None, None) if hx is None else (hx[0][0], hx[1][0])
        x_gates = self.ih(x)  # one 3-D Linear call over all time steps
        outputs = []
        for t in range(x.shape[1]):
            gates = x_gates[:, t] if h is None else x_gates[:, t] + self.hh(h)
            i, f, g, o = gates.chunk(4, dim=-1)
            c = torch.sigmoid(i) * torch.tanh(g) if c is None else torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        return torch.stack(outputs, dim=1), (h.unsqueeze(0), c.unsqueeze(0))


def _unroll(module: LSTM) -> Callable[[], None]:
    """Clipping ``prepare`` step: the step-by-step forward, in which ``ih`` and ``hh`` are used
    only through their own (hooked) ``nn.Linear`` calls; the returned undo restores the flag."""
    before = module.unrolled
    module.unrolled = True

    def undo() -> None:
        module.unrolled = before
    return undo


# The LSTM owns no parameter itself (min_batched_ndim 3: input [B, T, input_size]).
register_rule(LSTM, LayerRule(no_contributions, (), lambda m: 3, prepare=_unroll))
register_hint(nn.LSTM, "use fedpriv.models.LSTM (gates are nn.Linear) instead of nn.LSTM")
register_hint(nn.GRU, "build the recurrent cell from nn.Linear pieces (as fedpriv.models.LSTM does)")
register_hint(nn.RNN, "build the recurrent cell from nn.Linear pieces (as fedpriv.models.LSTM does)")
register_hint(nn.LSTMCell, "use fedpriv.models.LSTM, or nn.Linear gates, instead of nn.LSTMCell")


class LSTMLanguageModel(nn.Module):
    """Embedding → LSTM → Linear projection → Linear output (TFF StackOverflow baseline).

    Defaults (embed 96, hidden 670, projection 96) give 4,050,748 parameters at vocab 10,004.
    """

    def __init__(self, vocab_size: int, embed_dim: int = 96, hidden_size: int = 670,
                 projection_dim: int = 96, pad_id: int = 0, tie_embeddings: bool = False) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        self.lstm = LSTM(embed_dim, hidden_size)
        self.projection = nn.Linear(hidden_size, projection_dim)
        self.output = nn.Linear(projection_dim, vocab_size)
        if tie_embeddings:  # output weight = input embedding (needs projection_dim == embed_dim)
            if projection_dim != embed_dim:
                raise ValueError(f"tie_embeddings needs projection_dim == embed_dim, got {projection_dim} != {embed_dim}")
            self.output.weight = self.embedding.weight

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens``: int [B, T] → the output layer's input [B, T, projection_dim]."""
        hidden, _ = self.lstm(self.embedding(tokens))
        return self.projection(hidden)

    def head(self, features: torch.Tensor) -> torch.Tensor:
        """Output layer: features [..., projection_dim] → logits [..., vocab_size]."""
        return self.output(features)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens``: int [B, T] → logits [B, T, vocab_size]."""
        return self.head(self.features(tokens))


# --- config options (fedpriv/schema.py registers them with Hydra) --------------------------------


@dataclass
class LSTMModel(ModelOption):
    model_class: ClassVar[type] = LSTMLanguageModel
    name: str = "lstm"
    embed_dim: int = 64
    hidden_size: int = 128
    projection_dim: int = 64

    def check(self, path: str) -> None:
        positive(self, "embed_dim", "hidden_size", "projection_dim", path=path)


register_option("model", "lstm", LSTMModel())
# the smoke experiment's size (`+experiment=smoke`; `model=` still switches architecture)
register_option("model", "lstm_tiny", LSTMModel(embed_dim=16, hidden_size=32, projection_dim=16))

