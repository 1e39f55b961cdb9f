"""A small causal transformer LM built only from Embedding, Linear and LayerNorm modules.

Pre-LayerNorm blocks; attention uses ``scaled_dot_product_attention`` (no trainable parameters
outside the Linear projections) so per-sample clipping sees every weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fedpriv.clipping import flat_positions
from fedpriv.schema import ModelOption, divisible, positive, register_option


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.explicit = False  # softmax(q kᵀ/√d + causal mask) v spelt out (vmappable; set by fedpriv.models.vmappable)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        if self.explicit:
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d_model: int, num_heads: int, ff_dim: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, num_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff_in = nn.Linear(d_model, ff_dim)
        self.ff_out = nn.Linear(ff_dim, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ff_out(F.gelu(self.ff_in(self.ln2(x))))


class TransformerLanguageModel(nn.Module):
    """Token + learned position embeddings, ``num_layers`` pre-LN blocks, final LayerNorm, head.

    Defaults (d 96, 3 layers, 8 heads, ff 1536) follow pfl-research's StackOverflow transformer.
    """

    def __init__(self, vocab_size: int, d_model: int = 96, num_layers: int = 3, num_heads: int = 8,
                 ff_dim: int = 1536, max_len: int = 64, tie_embeddings: bool = False,
                 pad_id: int = 0) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.position_embedding = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, num_heads, ff_dim) for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.head.weight = self.token_embedding.weight

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens``: int [B, T] (T <= max_len) → the head's input [B, T, d_model]."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def forward(self, tokens: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """``tokens``: int [B, T] (T <= max_len) → logits [B, T, vocab_size]; with a bool ``keep``
        [B, T], the logits at the kept positions only, [N, vocab_size]
        (:func:`fedpriv.clipping.flat_positions`)."""
        features = self.features(tokens)
        return self.head(features if keep is None else flat_positions(features, keep))


# --- config options (fedpriv/schema/parser.py registers them with Hydra) -------------------------


@dataclass
class TransformerModel(ModelOption):
    model_class: ClassVar[type] = TransformerLanguageModel
    name: str = "transformer"
    d_model: int = 96  # width of the embedding and residual stream
    num_layers: int = 3  # transformer blocks
    num_heads: int = 8  # attention heads (divide d_model)
    ff_dim: int = 1536  # hidden width of each block's feed-forward layer

    def check(self, path: str) -> None:
        positive(self, "d_model", "num_layers", "num_heads", "ff_dim", path=path)
        divisible(self, "d_model", "num_heads", path)

    def extra_model_args(self, seq_len: int) -> dict:
        return {"max_len": seq_len}  # positions: the dataset's row length


register_option("model", "transformer", TransformerModel())
register_option("model", "transformer_tiny", TransformerModel(d_model=32, num_layers=2, num_heads=4, ff_dim=64))

