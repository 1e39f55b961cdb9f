"""LoRA adapters for Hugging Face causal LMs (peft), trained under Book-Keeping clipping.

:func:`add_lora` injects peft LoRA adapters into ``model`` in place (``peft.inject_adapter_in_model``,
not ``get_peft_model``): the model keeps its own class and forward (``model(input_ids, ...)``
returns ``.logits`` exactly as before, ``model.config`` and ``generate`` unchanged), no
``PeftModel``/``LoraModel`` wrapper is added to the module tree, and only the adapted layers'
parameter names change. Every base weight is frozen (``requires_grad=False``); only the LoRA
``lora_A``/``lora_B`` matrices train. One forward pre-hook is added: with grad enabled,
``model(input_ids, ...)`` looks up the frozen input embeddings first and runs as
``model(inputs_embeds=..., ...)`` (the same computation), so that BK can prove from autograd's
graph that the first adapters' inputs are per sample (see :func:`look_up_embeddings_first`). Give
the LoRA model itself to ``BookKeeping`` (not a module that calls it).

Under :class:`fedpriv.clipping.BookKeeping` nothing extra is needed: peft's LoRA layer (the
wrapper around an ``nn.Linear`` or GPT-2 ``Conv1D``) owns no trainable parameter itself; its
frozen base layer is called as before and the adapter path is ``lora_B(lora_A(dropout(x)))``,
two plain ``nn.Linear`` calls (no bias) that the core ``nn.Linear`` rule clips per sample. Frozen
parameters get no gradient and no noise, so the clipped, noised update (and what a client sends,
:func:`lora_state_dict`) is the adapters only.

peft is an optional extra (``pip install -e .[hf]``): it is imported inside :func:`add_lora`
only, never when this module is imported.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import nn

#: Default targets by ``model.config.model_type``: GPT-2's Conv1D projections (attention c_attn
#: and c_proj, MLP c_fc and c_proj); Llama-style attention and SwiGLU MLP projections (nn.Linear).
GPT2_TARGETS = ("c_attn", "c_proj", "c_fc")
LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "gpt2": GPT2_TARGETS,
    "llama": LLAMA_TARGETS,
    "mistral": LLAMA_TARGETS,
    "qwen2": LLAMA_TARGETS,
    "qwen3": LLAMA_TARGETS,
    "gemma": LLAMA_TARGETS,
    "gemma2": LLAMA_TARGETS,
    "olmo2": LLAMA_TARGETS,
}

_ADAPTER_KEYS = (".lora_A.", ".lora_B.")
_HF_HINT = "peft is needed for LoRA adapters: install the hf extra (pip install -e .[hf])"


def _import_peft():
    try:
        import peft  # lazy: optional package (the hf extra)
    except ImportError as exc:
        raise ImportError(_HF_HINT) from exc
    return peft


def _adaptable(module: nn.Module) -> Optional[str]:
    """``"linear"`` for nn.Linear, ``"conv1d"`` for transformers' Conv1D (weight [in, out]), else None."""
    if type(module) is nn.Linear:
        return "linear"
    kind = type(module)
    if kind.__name__ == "Conv1D" and kind.__module__.startswith("transformers."):
        return "conv1d"
    return None


def _matches(path: str, target: str) -> bool:
    """peft's rule for a string target: the module's full name, or its name's last components."""
    return path == target or path.endswith("." + target)


def _describe(model: nn.Module) -> str:
    names = sorted({path.rsplit(".", 1)[-1] for path, m in model.named_modules() if path and _adaptable(m)})
    return f"{type(model).__name__} (its Linear/Conv1D modules: {', '.join(names) or 'none'})"


def _resolve_targets(model: nn.Module, targets: Optional[Sequence[str]]) -> tuple[list[str], bool]:
    """The target names and whether they are Conv1D layers (peft's fan_in_fan_out); ValueError if
    a target matches no Linear/Conv1D module or matches another kind of module."""
    if targets is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        targets = DEFAULT_TARGETS.get(model_type)
        if targets is None:
            raise ValueError(f"add_lora cannot guess the target modules of {_describe(model)}; "
                             "pass targets=[...]")
    elif isinstance(targets, str) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(f"targets must be a non-empty sequence of module names, got {targets!r}")
    modules = [(path, m) for path, m in model.named_modules() if path]
    kinds: set[str] = set()
    for target in targets:
        hits = [(path, m) for path, m in modules if _matches(path, target)]
        if not hits:
            raise ValueError(f"LoRA target {target!r} matches no module of {_describe(model)}")
        other = [f"{path} ({type(m).__name__})" for path, m in hits if not _adaptable(m)]
        if other:
            raise ValueError(f"LoRA target {target!r} matches {other[0]}, not a Linear/Conv1D layer, in "
                             f"{_describe(model)}")
        kinds.update(_adaptable(m) for _, m in hits)
    if kinds == {"linear", "conv1d"}:
        raise ValueError(f"targets {list(targets)} mix nn.Linear and Conv1D layers (weights stored "
                         f"transposed to each other), which add_lora does not support; pick targets of one kind in "
                         f"{_describe(model)}")
    return list(targets), kinds == {"conv1d"}


def add_lora(model: nn.Module, rank: int, targets: Optional[Sequence[str]] = None,
             alpha: Optional[float] = None, dropout: float = 0.0) -> nn.Module:
    """Inject LoRA adapters of ``rank`` into ``model`` (in place, returned) and freeze every base
    parameter, so that only the adapters' ``lora_A``/``lora_B`` weights require grad.

    ``targets``: module names as peft matches them (a full path or its trailing components, e.g.
    ``"c_attn"``); ``None`` picks :data:`DEFAULT_TARGETS` by ``model.config.model_type`` and raises
    ``ValueError`` for a family it does not know. ``alpha``: LoRA's ``lora_alpha`` (the update is
    scaled by ``alpha / rank``); ``None`` means ``alpha = rank`` (scale 1). ``dropout``: on the
    adapter input (0 for exact per-sample clipping tests; any value keeps samples separate). As in
    peft, ``lora_B`` starts at zero, so the adapted model first computes the base model's function.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"LoRA rank must be an integer >= 1, got {rank!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"LoRA dropout must be in [0, 1), got {dropout!r}")
    if alpha is not None and not alpha > 0:
        raise ValueError(f"LoRA alpha must be positive, got {alpha!r}")
    names, fan_in_fan_out = _resolve_targets(model, targets)
    peft = _import_peft()
    config = peft.LoraConfig(r=rank, lora_alpha=float(rank if alpha is None else alpha), lora_dropout=dropout,
                             target_modules=names, fan_in_fan_out=fan_in_fan_out, bias="none")
    model = peft.inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_(_is_adapter(name))
    look_up_embeddings_first(model)
    return model


def look_up_embeddings_first(model: nn.Module, lookup: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> None:
    """Make ``model(input_ids, ...)`` with grad enabled run as ``model(inputs_embeds=E[input_ids], ...)``,
    E the (frozen) input embedding ``model.get_input_embeddings()``, an identical computation.
    ``lookup``: ids -> embeddings where ``model`` maps ids before the lookup (default: E itself).

    Why: Book-Keeping proves which rows of a hooked call's input are per sample from autograd's
    graph, starting at the model's float inputs (:mod:`fedpriv.clipping.provenance`). With every base
    weight frozen, nothing before the first adapter requires grad, so the first adapters' inputs
    (e.g. ``ln_1(wte[ids] + wpe[pos])``) have no graph and would be refused as unprovable. A
    float ``inputs_embeds`` argument is a model input that BK traces, and each of its rows is the
    lookup of one sample's row of ``input_ids``. Registered first among the model's forward
    pre-hooks (before BK's): install it on the module given to ``BookKeeping``. Under
    ``torch.no_grad()`` (``generate``, evaluation), with ``inputs_embeds`` given, or with a
    trainable input embedding, nothing changes.
    """
    if not callable(getattr(model, "get_input_embeddings", None)):
        return
    old = getattr(model, "_fedpriv_lora_embed_hook", None)
    if old is not None:
        old.remove()

    def hook(module: nn.Module, args: tuple, kwargs: dict):
        if not torch.is_grad_enabled() or kwargs.get("inputs_embeds") is not None:
            return None
        try:
            embedding = module.get_input_embeddings()
        except NotImplementedError:
            return None
        if not isinstance(embedding, nn.Module) or any(p.requires_grad for p in embedding.parameters()):
            return None  # a trainable embedding is a hooked call: BK traces from its output
        if args and isinstance(args[0], torch.Tensor):
            ids, args = args[0], (None,) + tuple(args[1:])
        elif isinstance(kwargs.get("input_ids"), torch.Tensor):
            ids = kwargs["input_ids"]
        else:
            return None
        if ids.is_floating_point():
            return None
        rest = {k: v for k, v in kwargs.items() if k != "input_ids"}
        return args, {"inputs_embeds": (lookup or embedding)(ids), **rest}

    model._fedpriv_lora_embed_hook = model.register_forward_pre_hook(hook, with_kwargs=True, prepend=True)


def _is_adapter(name: str) -> bool:
    return any(key in name for key in _ADAPTER_KEYS)


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors only (every ``lora_A``/``lora_B`` weight, by parameter name), detached
    copies: what a client sends. Base weights are never included."""
    return {name: p.detach().clone() for name, p in model.named_parameters(remove_duplicate=True)
            if _is_adapter(name)}


def trainable_parameter_count(model: nn.Module) -> int:
    """Number of scalars in parameters that require grad (each shared parameter counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def merge_adapters(model: nn.Module) -> nn.Module:
    """``model`` (in place, returned) with every LoRA layer merged into its base layer
    (``W + (alpha/r) B A``, peft's ``merge``) and replaced by that layer: the base architecture,
    loadable without peft. The embedding pre-hook and peft's config are removed."""
    from peft.tuners.tuners_utils import BaseTunerLayer  # lazy: optional package (the hf extra)

    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            module.merge()
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, module.get_base_layer())
    hook = getattr(model, "_fedpriv_lora_embed_hook", None)
    if hook is not None:
        hook.remove()
        del model._fedpriv_lora_embed_hook
    if hasattr(model, "peft_config"):
        del model.peft_config
    return model
