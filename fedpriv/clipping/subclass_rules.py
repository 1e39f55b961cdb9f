"""Rules for subclasses of ``nn.Linear`` and ``nn.Embedding`` (Gemma's ``*ScaledWordEmbedding``,
``W[idx]·√d``; XGLM's; Falcon's ``FalconLinear``, ``x Wᵀ + b`` written out), recognised from what
their forward computes, not from their name.

A subclass without a rule of its own is accepted when its forward is an affine function of the
base layer's output: ``y = s · base(x; W, b) + c`` with a scalar ``s ≠ 0`` and a ``c`` that depends
on neither the input nor the weights (``base`` is ``F.linear`` or ``F.embedding``). Then
``∂L/∂W = s · (the base rule's contribution of ∂L/∂y)``: the base layer's rule applied to ``s·g``.
The check runs once, when the engine inspects the model: the forward on two probe inputs and at
two weight settings (``W, b`` and ``2W, 2b``, by ``torch.func.functional_call``, nothing written),
once under ``torch.no_grad()`` and once with grad enabled and the weights requiring grad (a forward
that differs between the two is refused), the RNG state restored. A forward that reads other inputs
(OPT's positions from an attention mask), mixes weights otherwise, or scales per feature is refused
with the reason.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fedpriv.clipping.rules import LayerRule, _embedding_problem, embedding_contributions, linear_contributions

RTOL = 1e-5


def _base(module: nn.Module, x: Tensor, weights: dict[str, Tensor]) -> Tensor:
    if isinstance(module, nn.Embedding):
        return F.embedding(x, weights["weight"])
    return F.linear(x, weights["weight"], weights.get("bias"))


def _probe_input(module: nn.Module, generator: torch.Generator) -> Tensor:
    device = module.weight.device
    if isinstance(module, nn.Embedding):
        return torch.randint(0, module.num_embeddings, (2, 5), generator=generator).to(device)
    return torch.randn(2, 3, module.in_features, generator=generator).to(device, module.weight.dtype)


def _close(a: Tensor, b: Tensor, scale: float) -> bool:
    return a.shape == b.shape and bool(((a - b).abs().max() <= RTOL * max(scale, 1e-12)))


def _scale_in_mode(module: Union[nn.Linear, nn.Embedding], grad: bool) -> Union[float, str]:
    """``s`` of the module docstring's form with autograd on (``grad``: weights and float probe
    inputs require grad, as in training) or off, or the reason it is not of that form."""
    weights = {n: p.detach().requires_grad_(grad) for n, p in module.named_parameters(recurse=False)
               if n in ("weight", "bias")}
    doubled = {n: (2 * w).detach().requires_grad_(grad) for n, w in weights.items()}
    generator = torch.Generator().manual_seed(0x5CA1E)  # fixed probe inputs of a structural check
    offsets = []
    scale = None
    with torch.set_grad_enabled(grad), torch.random.fork_rng(devices=[]):
        for _ in range(2):
            x = _probe_input(module, generator)
            if grad and x.is_floating_point():
                x.requires_grad_(True)
            try:
                once = functional_call(module, weights, (x,))
                twice = functional_call(module, doubled, (x,))
            except Exception as err:  # noqa: BLE001 - a forward that does not take the base layer's input
                return (f"its forward is not the base layer's computation on its input (called as one, it "
                        f"raised {type(err).__name__}: {err})")
            if not isinstance(once, Tensor) or not isinstance(twice, Tensor):
                return "its forward does not return one tensor"
            once, twice, x = once.detach(), twice.detach(), x.detach()
            ref = _base(module, x, {n: w.detach() for n, w in weights.items()})
            if once.shape != ref.shape:
                return f"its output has shape {tuple(once.shape)}, the base layer's {tuple(ref.shape)}"
            linear = (twice - once).double()
            ref64 = ref.double()
            norm = float(ref64.pow(2).sum())
            s = float((linear * ref64).sum() / norm) if norm > 0 else 0.0
            magnitude = float(once.abs().max()) + float(ref.abs().max())
            if s == 0.0 or not _close(linear, s * ref64, abs(s) * float(ref.abs().max())):
                return "its output is not a scalar multiple of the base layer's plus a constant"
            if scale is not None and abs(s - scale) > RTOL * abs(scale):
                return "its scale changes with the input"
            scale = s
            offsets.append(once.double() - s * ref64)
    if not _close(offsets[0], offsets[1], magnitude):
        return "its offset depends on the input"
    return float(scale)


def hf_family(cls: type) -> Optional[str]:
    """The ``transformers`` model family defining ``cls`` (``transformers.models.opt.modeling_opt``
    → ``"opt"``), from its module name only (nothing imported), or None."""
    parts = cls.__module__.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["transformers", "models"] else None


def base_scale(module: Union[nn.Linear, nn.Embedding]) -> Union[float, str]:
    """``s`` of ``y = s · base(x) + c`` (module docstring), or the reason it is not of that form.
    Probed with autograd off and on (training runs with it on): a forward that computes something
    else in one mode (branching on ``torch.is_grad_enabled()`` or ``requires_grad``) is refused."""
    plain, trained = _scale_in_mode(module, False), _scale_in_mode(module, True)
    if isinstance(trained, str) or isinstance(plain, str):
        if plain == trained:
            return trained
        return f"with grad enabled {trained}" if isinstance(trained, str) else f"under torch.no_grad() {plain}"
    if abs(trained - plain) > RTOL * abs(plain):
        return (f"its scale is {trained:g} with grad enabled and {plain:g} under torch.no_grad() (its forward "
                "depends on the grad mode)")
    return trained


def subclass_rule(module: nn.Module) -> Optional[Union[LayerRule, str]]:
    """The rule of an ``nn.Linear``/``nn.Embedding`` subclass without a registered rule (its base
    rule on ``s · g``), the reason it is refused, or None when ``module`` is no such subclass."""
    if type(module) in (nn.Linear, nn.Embedding) or not isinstance(module, (nn.Linear, nn.Embedding)):
        return None
    s = base_scale(module)
    if isinstance(s, str):
        reason = f"it subclasses nn.{'Embedding' if isinstance(module, nn.Embedding) else 'Linear'} but {s}"
        family = hf_family(type(module))
        if family is not None:  # a family's own layer: not the user's to register a rule for
            return f"the Hugging Face family {family!r} is not supported under per-sample clipping: {reason}"
        return f"{reason}; register a rule for it with fedpriv.clipping.register_rule"
    if isinstance(module, nn.Embedding):
        return LayerRule(lambda m, idx, g: embedding_contributions(m, idx, g * s), ("weight",), lambda m: 1,
                         index_input=True, check=_embedding_problem)
    return LayerRule(lambda m, x, g: linear_contributions(m, x, g * s), ("weight", "bias"), lambda m: 2)
