"""Per-layer rules: how one call of a supported module becomes per-sample gradient contributions.

A rule sees the call's (batch-first) input ``x`` and the gradient ``g`` of the loss w.r.t. the
call's output, and returns ``[(parameter, contribution), ...]`` for the module's *trainable*
parameters (see :mod:`fedpriv.clipping.contributions` for the three forms). Adding a layer type
is adding one function and one :func:`register_rule` line. Modules are matched by exact type: a
subclass may change ``forward``, so it must be registered on its own.

The registry is open: a module defined elsewhere (a model package) registers its own rule when
it is imported, so this package depends on no model. A composite module whose parameters all
live in registered submodules (a recurrent cell built from ``nn.Linear`` gates) registers a rule
with no parameters of its own and a ``prepare`` step that makes every parameter use a hooked
submodule call. :func:`register_hint` adds the advice given for a type that has no rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch.nn.functional as F
from torch import Tensor, nn

from fedpriv.clipping.contributions import Contribution, Dense, Outer, Rows

Contributions = list[tuple[nn.Parameter, Contribution]]


def _no_problem(module: nn.Module) -> Optional[str]:
    return None


@dataclass(frozen=True)
class LayerRule:
    """How BK handles one module type.

    ``contributions(module, x, g)``: the call's per-sample gradient contributions.
    ``params``: names of the module's own parameters the rule covers (others → unsupported).
    ``min_batched_ndim(module)``: fewest input dims of a batched call (fewer: one unbatched
    input, as PyTorch itself reads it). ``index_input``: the input holds indices (Embedding), so
    it is batched only with at least as many dims as the model's index input (see the engine).
    ``check(module)``: a reason the configured module is unsupported, or None.
    ``prepare(module)``: if given, run by the engine on every module of this type in the model
    (trainable or not) after all checks pass and before any forward; it switches the module to a
    forward in which each parameter is used only through calls of hooked submodules, and returns
    a function that undoes the switch (run when the engine detaches).
    """

    contributions: Callable[[nn.Module, Tensor, Tensor], Contributions]
    params: tuple[str, ...]
    min_batched_ndim: Callable[[nn.Module], int]
    index_input: bool = False
    check: Callable[[nn.Module], Optional[str]] = _no_problem
    prepare: Optional[Callable[[nn.Module], Callable[[], None]]] = None


RULES: dict[type, LayerRule] = {}
HINTS: dict[type, str] = {}
# each registered type's ``forward`` as it was registered (a forward patched on the class later is not the rule's)
FORWARDS: dict[type, Callable] = {}


def register_rule(module_type: type, rule: LayerRule) -> None:
    """Register (or replace) the rule for modules whose type is exactly ``module_type`` (its ``forward``, as it is
    now, is the one the rule describes)."""
    RULES[module_type] = rule
    FORWARDS[module_type] = module_type.forward


def register_hint(module_type: type, hint: str) -> None:
    """Register (or replace) the advice in the error for a trainable module of ``module_type``
    (or a subclass; the nearest registered class in its MRO wins) that has no rule."""
    HINTS[module_type] = hint


def no_contributions(module: nn.Module, x: Tensor, g: Tensor) -> Contributions:
    """Contributions of a composite module that owns no parameter itself (``params=()``): none;
    its submodules' own rules cover every parameter."""
    return []


def _trainable(p: Optional[nn.Parameter]) -> bool:
    return p is not None and p.requires_grad


def _sum_positions(left: Tensor) -> Tensor:
    """``Σ_t g_t`` per sample of ``left`` [B, T, d] (a bias's gradient); with one position per
    sample (flattened positions, a single output position) a view, not a copy."""
    return left[:, 0] if left.shape[1] == 1 else left.sum(1)


# ----------------------------------------------------------------------------- Linear


def linear_contributions(module: nn.Linear, x: Tensor, g: Tensor) -> Contributions:
    """``y = x Wᵀ + b`` on x [B, *, d]: ``G_W = Σ_t g_t x_tᵀ`` (Outer), ``G_b = Σ_t g_t`` (Dense)."""
    b = x.shape[0]
    left = g.reshape(b, -1, g.shape[-1])
    out: Contributions = []
    if _trainable(module.weight):
        out.append((module.weight, Outer(left, x.reshape(b, -1, x.shape[-1]))))
    if _trainable(module.bias):
        out.append((module.bias, Dense(_sum_positions(left))))
    return out


# ----------------------------------------------------------------------------- Embedding


def embedding_contributions(module: nn.Embedding, idx: Tensor, g: Tensor) -> Contributions:
    """``y = W[idx]``: ``G_W = Σ_t e_{idx_t} g_tᵀ`` (Rows); the ``padding_idx`` row gets nothing."""
    if not _trainable(module.weight):
        return []
    b = idx.shape[0]
    index = idx.reshape(b, -1)
    values = g.reshape(b, index.shape[1], module.embedding_dim)
    if module.padding_idx is not None:
        values = values.masked_fill((index == module.padding_idx).unsqueeze(-1), 0.0)
    return [(module.weight, Rows(index, values, module.num_embeddings))]


def _embedding_problem(module: nn.Embedding) -> Optional[str]:
    if module.max_norm is not None:
        return "max_norm renormalises the table in place during forward; set max_norm=None"
    if module.scale_grad_by_freq:
        return "scale_grad_by_freq couples samples through batch counts; set it False"
    return None


# ----------------------------------------------------------------------------- LayerNorm


def layer_norm_contributions(module: nn.LayerNorm, x: Tensor, g: Tensor) -> Contributions:
    """``y = x̂ ⊙ γ + β``: ``G_γ = Σ_t g_t ⊙ x̂_t``, ``G_β = Σ_t g_t`` (Dense).

    ``x̂ = (x - mean) / sqrt(var + eps)`` over the normalized dims is recomputed from the kept input
    (one fused ``layer_norm`` without affine parameters).
    """
    b = x.shape[0]
    out: Contributions = []
    if _trainable(module.weight):
        x_hat = F.layer_norm(x, module.normalized_shape, None, None, module.eps)
        per = (g * x_hat).reshape((b, -1) + tuple(module.normalized_shape)).sum(1)
        out.append((module.weight, Dense(per)))
    if _trainable(getattr(module, "bias", None)):
        out.append((module.bias, Dense(g.reshape((b, -1) + tuple(module.normalized_shape)).sum(1))))
    return out


# ----------------------------------------------------------------------------- RMSNorm


def rms_norm_contributions(module: nn.RMSNorm, x: Tensor, g: Tensor) -> Contributions:
    """``y = x̂ ⊙ γ`` with ``x̂ = x / sqrt(mean(x²) + eps)`` over the normalized dims:
    ``G_γ = Σ_t g_t ⊙ x̂_t`` (Dense); ``x̂`` is recomputed from the kept input by the same
    ``rms_norm`` without a weight (``eps=None``: the dtype's machine epsilon, as the module)."""
    if not _trainable(module.weight):
        return []
    shape = tuple(module.normalized_shape)
    x_hat = F.rms_norm(x, shape, None, module.eps)
    return [(module.weight, Dense((g * x_hat).reshape((x.shape[0], -1) + shape).sum(1)))]


# ----------------------------------------------------------------------------- Conv1d / Conv2d


def _conv_pad(module: nn.Module, x: Tensor) -> Tensor:
    """Apply the conv's padding explicitly (any padding_mode, int/tuple/'same'/'valid')."""
    spatial = len(module.kernel_size)
    if isinstance(module.padding, str):
        pairs = []
        for k, d in zip(module.kernel_size, module.dilation):
            total = d * (k - 1) if module.padding == "same" else 0
            pairs.append((total // 2, total - total // 2))  # PyTorch puts the odd one on the right
    else:
        pairs = [(p, p) for p in module.padding]
    flat = [v for pair in reversed(pairs) for v in pair]  # F.pad wants the last dim first
    if not any(flat):
        return x
    mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
    assert len(pairs) == spatial
    return F.pad(x, flat, mode=mode)


def conv_contributions(module: nn.Module, x: Tensor, g: Tensor) -> Contributions:
    """Conv as a Linear over unfolded patches: ``G_W = Σ_l g_l patch_lᵀ`` with l = output positions.

    x [B, C_in, *S] is padded, unfolded to [B, L, C_in·Πk] (channel-major, matching
    ``W.view(C_out, -1)``); g [B, C_out, *S'] → [B, L, C_out]. ``G_b = Σ_l g_l``. groups == 1 only.
    """
    b = x.shape[0]
    left = g.reshape(b, g.shape[1], -1).transpose(1, 2)
    out: Contributions = []
    if _trainable(module.weight):
        xp = _conv_pad(module, x)
        kernel, dilation, stride = module.kernel_size, module.dilation, module.stride
        if xp.dim() == 3:  # Conv1d: unfold as a 1×k 2-D patch
            xp = xp.unsqueeze(2)
            kernel, dilation, stride = (1,) + kernel, (1,) + dilation, (1,) + stride
        cols = F.unfold(xp, kernel, dilation=dilation, stride=stride)  # [B, C_in·Πk, L]
        out.append((module.weight, Outer(left, cols.transpose(1, 2))))
    if _trainable(module.bias):
        out.append((module.bias, Dense(_sum_positions(left))))
    return out


def _conv_problem(module: nn.Module) -> Optional[str]:
    if module.groups != 1:
        return f"groups={module.groups} is not supported (only groups=1)"
    return None


register_rule(nn.Linear, LayerRule(linear_contributions, ("weight", "bias"), lambda m: 2))
register_rule(nn.Embedding, LayerRule(embedding_contributions, ("weight",), lambda m: 1,
                                      index_input=True, check=_embedding_problem))
register_rule(nn.LayerNorm, LayerRule(layer_norm_contributions, ("weight", "bias"),
                                      lambda m: len(m.normalized_shape) + 1))
register_rule(nn.RMSNorm, LayerRule(rms_norm_contributions, ("weight",),
                                    lambda m: len(m.normalized_shape) + 1))
register_rule(nn.Conv1d, LayerRule(conv_contributions, ("weight", "bias"), lambda m: 3,
                                   check=_conv_problem))
register_rule(nn.Conv2d, LayerRule(conv_contributions, ("weight", "bias"), lambda m: 4,
                                   check=_conv_problem))

_RECURRENT = "build the recurrent cell from nn.Linear pieces, called once per time step"
register_hint(nn.LSTM, _RECURRENT)
register_hint(nn.GRU, _RECURRENT)
register_hint(nn.RNN, _RECURRENT)
register_hint(nn.LSTMCell, "build the cell from nn.Linear pieces")
register_hint(nn.GRUCell, "build the cell from nn.Linear pieces")
register_hint(nn.RNNCell, "build the cell from nn.Linear pieces")
register_hint(nn.MultiheadAttention, "use nn.Linear q/k/v and output projections with "
                                     "torch.nn.functional.scaled_dot_product_attention "
                                     "(as fedpriv's transformer language model does)")
