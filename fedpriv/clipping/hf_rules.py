"""Book-Keeping rules for Hugging Face ``transformers`` layers.

``transformers`` is an optional extra, so nothing else in :mod:`fedpriv.clipping` imports it: the
engine imports this module the first time it inspects a module whose class is defined in
``transformers`` (see ``fedpriv.clipping.engine._survey``), and importing it registers the rules below.
Every other layer of such a model is covered by the core rules (``nn.Linear``, ``nn.Embedding``,
``nn.LayerNorm``, ...) or owns no parameter (attention, rotary embeddings, activations). A class
that owns a trainable parameter and is in neither list still fails closed at construction, naming
its module path and class. Classes are matched by exact type, as every rule.

* ``transformers.pytorch_utils.Conv1D`` (GPT-2's attention and MLP projections): ``y = x W + b``
  with ``W`` of shape [in, out], the transpose of ``nn.Linear``'s: ``G_W = Σ_t x_t g_tᵀ`` (an
  :class:`Outer` with the factors in the other order), ``G_b = Σ_t g_t``.
* The RMSNorm classes of :data:`RMS_NORMS`: ``y = x̂ ⊙ w`` or, for Gemma's, ``y = x̂ ⊙ (1 + w)``,
  with ``x̂ = x / sqrt(mean(x²) + eps)`` over the last dim, computed in float32 as the classes
  do. In both cases ``G_w = Σ_t g_t ⊙ x̂_t`` (Dense). Each class's formula is checked against its
  own forward by the tests (``tests/test_clipping_hf.py``), never trusted from its name.
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch
from torch import Tensor, nn
from transformers.pytorch_utils import Conv1D

from fedpriv.clipping.contributions import Dense, Outer
from fedpriv.clipping.rules import Contributions, LayerRule, register_rule

# ----------------------------------------------------------------------------- Conv1D


def conv1d_transposed_contributions(module: Conv1D, x: Tensor, g: Tensor) -> Contributions:
    """``y = x W + b`` on x [B, *, in], W [in, out]: ``G_W = Σ_t x_t g_tᵀ`` (Outer), ``G_b = Σ_t g_t``."""
    b = x.shape[0]
    out_grad = g.reshape(b, -1, g.shape[-1])
    out: Contributions = []
    if module.weight.requires_grad:
        out.append((module.weight, Outer(x.reshape(b, -1, x.shape[-1]), out_grad)))
    if module.bias is not None and module.bias.requires_grad:
        out.append((module.bias, Dense(out_grad.sum(1))))
    return out


register_rule(Conv1D, LayerRule(conv1d_transposed_contributions, ("weight", "bias"), lambda m: 2))

# ----------------------------------------------------------------------------- RMSNorm family

#: ``(transformers module, class name) -> offset``: the class computes ``x̂ ⊙ (offset + w)``.
RMS_NORM_FAMILIES: dict[tuple[str, str], float] = {
    ("transformers.models.llama.modeling_llama", "LlamaRMSNorm"): 0.0,
    ("transformers.models.mistral.modeling_mistral", "MistralRMSNorm"): 0.0,
    ("transformers.models.mixtral.modeling_mixtral", "MixtralRMSNorm"): 0.0,
    ("transformers.models.qwen2.modeling_qwen2", "Qwen2RMSNorm"): 0.0,
    ("transformers.models.qwen3.modeling_qwen3", "Qwen3RMSNorm"): 0.0,
    ("transformers.models.phi3.modeling_phi3", "Phi3RMSNorm"): 0.0,
    ("transformers.models.olmo2.modeling_olmo2", "Olmo2RMSNorm"): 0.0,
    ("transformers.models.gemma.modeling_gemma", "GemmaRMSNorm"): 1.0,
    ("transformers.models.gemma2.modeling_gemma2", "Gemma2RMSNorm"): 1.0,
    ("transformers.models.gemma3.modeling_gemma3", "Gemma3RMSNorm"): 1.0,
}

#: The RMSNorm classes registered here (those this transformers version has), with their offset.
RMS_NORMS: dict[type, float] = {}


def _eps(module: nn.Module) -> float:
    eps = getattr(module, "variance_epsilon", None)
    return float(module.eps if eps is None else eps)


def rms_normalized(module: nn.Module, x: Tensor) -> Tensor:
    """``x̂ = x / sqrt(mean(x²) + eps)`` over the last dim, in float32 (as the classes compute it)."""
    x32 = x.to(torch.float32)
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + _eps(module))


def rms_reconstruct(module: nn.Module, x: Tensor) -> Tensor:
    """What the rule assumes the module's forward is: ``x̂ ⊙ (offset + w)`` (float32); the tests
    compare it with the class's own forward."""
    return rms_normalized(module, x) * (RMS_NORMS[type(module)] + module.weight.to(torch.float32))


def rms_norm_family_contributions(module: nn.Module, x: Tensor, g: Tensor) -> Contributions:
    """``G_w = Σ_t g_t ⊙ x̂_t`` (Dense), for ``w`` and ``1 + w`` alike (float32, cast to w's dtype)."""
    if not module.weight.requires_grad:
        return []
    d = module.weight.shape[0]
    per = (g.to(torch.float32) * rms_normalized(module, x)).reshape(x.shape[0], -1, d).sum(1)
    return [(module.weight, Dense(per.to(module.weight.dtype)))]


def _rms_problem(module: nn.Module) -> Optional[str]:
    weight = getattr(module, "weight", None)
    if weight is None or weight.dim() != 1:
        return "the RMSNorm rule needs a 1-D weight over the last dim"
    if getattr(module, "variance_epsilon", getattr(module, "eps", None)) is None:
        return "the RMSNorm rule needs eps (variance_epsilon or eps)"
    return None


def _register_rms_norms() -> None:
    """Register every family class this transformers version has (a missing one is skipped)."""
    for (where, name), offset in RMS_NORM_FAMILIES.items():
        try:
            kind = getattr(importlib.import_module(where), name)
        except (ImportError, AttributeError):
            continue
        RMS_NORMS[kind] = offset
        register_rule(kind, LayerRule(rms_norm_family_contributions, ("weight",), lambda m: 2,
                                      check=_rms_problem))


_register_rms_norms()
