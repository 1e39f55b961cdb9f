"""Where a run's tensors live: ``device=auto|cpu|cuda`` (auto: CUDA when this process sees a GPU).

Client training (the per-client loop and cohort-parallel chunks), Book-Keeping clipping, the
one-pass DP-FedSGD round and evaluation run on the device; the server's aggregate, mechanism
noise, optimizer and EMA are kept in host memory, where a Flower message delivers the deltas.
"""

from __future__ import annotations

import torch

from fedpriv.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """The ``torch.device`` for ``device=name``; ``ConfigError`` for ``cuda`` where CUDA is absent."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda, but this process sees no CUDA device (torch.cuda.is_available() is "
                          "false): use device=cpu or device=auto")
    if name not in ("cpu", "cuda"):
        raise ConfigError(f"device must be auto, cpu or cuda, got {name!r}")
    return torch.device(name)
