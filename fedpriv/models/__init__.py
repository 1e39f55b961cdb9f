"""Language models built so per-sample clipping can see every weight, and flat-vector helpers."""

from __future__ import annotations

import copy

from torch import nn

from fedpriv.errors import ConfigError
from fedpriv.models.lstm import LSTM, LSTMLanguageModel
from fedpriv.models.transformer import CausalSelfAttention, TransformerLanguageModel
from fedpriv.models.flat import get_flat_params, set_flat_params
from fedpriv.models import hf as _hf  # noqa: F401 (registers model=hf; transformers is imported on use only)
from fedpriv.schema import options



def build_model(name: str, vocab_size: int, pad_id: int = 0, **kwargs) -> nn.Module:
    """Instantiate the model ``name`` (a registered model option's ``name``: ``lstm``,
    ``transformer``) with keyword hyper-parameters."""
    classes = {option.name: option.model_class for option in options("model").values()}
    if name not in classes:
        raise ConfigError(f"unknown model {name!r} (choose one of: {', '.join(sorted(classes))})")
    return classes[name](vocab_size=vocab_size, pad_id=pad_id, **kwargs)


def vmappable(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose forward runs under ``torch.func.vmap`` over stacked parameters
    (cohort-parallel training): every :class:`LSTM` takes its lockstep forward and attention is
    spelt out, since the fused LSTM and attention kernels have no batching rule (vmap would loop
    over the clients one by one). Same function; the copy carries no module hooks."""
    replica = copy.deepcopy(model)
    for module in replica.modules():
        for hooks in (module._forward_hooks, module._forward_pre_hooks, module._forward_hooks_with_kwargs,
                      module._forward_pre_hooks_with_kwargs, module._forward_hooks_always_called,
                      module._backward_hooks, module._backward_pre_hooks):
            hooks.clear()  # a per-sample clipping engine's hooks must not follow the copy
        if isinstance(module, LSTM):
            module.per_sample = False
            module.unrolled = True
            module.lockstep = True  # the recurrence's own BPTT (one W_hh gradient GEMM per step of training)
        elif isinstance(module, CausalSelfAttention):
            module.explicit = True
    return replica


__all__ = ["LSTM", "LSTMLanguageModel", "TransformerLanguageModel", "build_model",
           "get_flat_params", "set_flat_params", "vmappable"]
