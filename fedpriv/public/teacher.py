"""The embedded public teacher: a larger transformer LM trained (non-privately) on the public
corpus only, cached on disk keyed by the corpus digest, its config and the seed."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from fedpriv.release.atomic import write_atomic
from fedpriv.cache import cache_root
from fedpriv.metrics import token_loss
from fedpriv.models import TransformerLanguageModel

TEACHER_DEFAULTS = {"d_model": 128, "num_layers": 2, "num_heads": 4, "ff_dim": 512}


def train_teacher(rows: np.ndarray, vocab_size: int, seq_len: int, model_cfg: Mapping[str, Any], steps: int,
                  batch_size: int, lr: float, seed: int, pad_id: int = 0) -> nn.Module:
    """Adam on ``rows`` (public) for ``steps`` minibatches; returns the teacher in eval mode."""
    torch.manual_seed(seed)
    teacher = TransformerLanguageModel(vocab_size, max_len=seq_len, pad_id=pad_id,
                                       **{**TEACHER_DEFAULTS, **dict(model_cfg)})
    opt = torch.optim.Adam(teacher.parameters(), lr=lr)
    data = torch.as_tensor(rows, dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    teacher.train()
    for _ in range(steps):
        idx = torch.randint(0, len(data), (batch_size,), generator=gen)
        opt.zero_grad(set_to_none=True)
        token_loss(teacher, data[idx], pad_id).backward()
        opt.step()
    return teacher.eval()


def embedded_teacher(rows: np.ndarray, vocab_size: int, seq_len: int, model_cfg: Mapping[str, Any], steps: int,
                     batch_size: int, lr: float, seed: int, pad_id: int = 0) -> nn.Module:
    """:func:`train_teacher`, cached under ``$FEDPRIV_CACHE/teachers`` (atomic write)."""
    spec = {"rows": hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest(), "vocab": vocab_size,
            "seq_len": seq_len, "model": {**TEACHER_DEFAULTS, **dict(model_cfg)}, "steps": steps,
            "batch_size": batch_size, "lr": lr, "seed": seed, "pad": pad_id, "version": 1}
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:24]
    path = cache_root() / "teachers" / f"{key}.pt"
    teacher = TransformerLanguageModel(vocab_size, max_len=seq_len, pad_id=pad_id, **spec["model"])
    if path.exists():
        teacher.load_state_dict(torch.load(path, weights_only=True))
        return teacher.eval()
    teacher = train_teacher(rows, vocab_size, seq_len, model_cfg, steps, batch_size, lr, seed, pad_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(teacher.state_dict(), buffer)
    write_atomic(path, buffer.getvalue())
    return teacher
