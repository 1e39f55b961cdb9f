"""Server optimizers. They consume the privatized average delta Δ̄_t (post-processing, so any
optimizer keeps the DP guarantee) and treat ``g_t = −Δ̄_t`` as the pseudo-gradient.
"""

from __future__ import annotations

import math

import torch

from fedpriv.errors import ConfigError


def cosine_factor(step: int, total_steps: int | None) -> float:
    """Learning-rate factor ``(1 + cos(π·step/total))/2`` of step ``step`` (0-based); 1 without a total."""
    if not total_steps:
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / total_steps))


class ServerSGD:
    """``m ← β m + Δ̄``; ``θ ← θ + η_t m`` (β = 0: plain FedAvg with server learning rate η).

    With ``decay_steps`` the rate follows a cosine decay ``η_t = η·(1 + cos(πt/T))/2``: late rounds
    take smaller steps, which lowers the noise floor of the privatized iterates.
    """

    def __init__(self, lr: float = 1.0, momentum: float = 0.0, decay_steps: int | None = None) -> None:
        self.lr, self.momentum, self.decay_steps = lr, momentum, decay_steps
        self.buffer: torch.Tensor | None = None
        self.t = 0

    def step(self, params: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        if self.momentum:
            self.buffer = update.clone() if self.buffer is None else self.momentum * self.buffer + update
            update = self.buffer
        lr = self.lr * cosine_factor(self.t, self.decay_steps)
        self.t += 1
        return params + lr * update

    def state_dict(self) -> dict:
        return {"buffer": self.buffer, "t": self.t}

    def load_state_dict(self, state: dict) -> None:
        self.buffer, self.t = state["buffer"], state["t"]


class ServerAdam:
    """Adam on ``g = −Δ̄`` with bias correction (Kingma & Ba; FedAdam of Reddi et al.)."""

    def __init__(self, lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-3) -> None:
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.m: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.t = 0

    def step(self, params: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        g = -update
        if self.m is None:
            self.m, self.v = torch.zeros_like(g), torch.zeros_like(g)
        self.t += 1
        self.m = self.beta1 * self.m + (1 - self.beta1) * g
        self.v = self.beta2 * self.v + (1 - self.beta2) * g * g
        m_hat = self.m / (1 - self.beta1 ** self.t)
        v_hat = self.v / (1 - self.beta2 ** self.t)
        return params - self.lr * m_hat / (v_hat.sqrt() + self.eps)

    def state_dict(self) -> dict:
        return {"m": self.m, "v": self.v, "t": self.t}

    def load_state_dict(self, state: dict) -> None:
        self.m, self.v, self.t = state["m"], state["v"], state["t"]


def build_server_optimizer(name: str, rounds: int | None = None, **kwargs) -> ServerSGD | ServerAdam:
    """``sgd`` / ``momentum`` (SGD with momentum, default 0.9) / ``adam``.

    ``schedule: cosine`` (SGD variants) decays the rate to 0 over ``rounds``; ``constant`` keeps it.
    """
    schedule = kwargs.get("schedule", "constant")
    if schedule not in ("constant", "cosine"):
        raise ConfigError(f"unknown optimizer.schedule {schedule!r} (choose one of: constant, cosine)")
    decay = rounds if schedule == "cosine" else None
    if name == "sgd":
        return ServerSGD(lr=kwargs.get("lr", 1.0), momentum=kwargs.get("momentum", 0.0), decay_steps=decay)
    if name == "momentum":
        return ServerSGD(lr=kwargs.get("lr", 1.0), momentum=kwargs.get("momentum", 0.9), decay_steps=decay)
    if name == "adam":
        return ServerAdam(**{k: v for k, v in kwargs.items() if k in ("lr", "beta1", "beta2", "eps")})
    raise ConfigError(f"unknown server optimizer {name!r} (choose one of: adam, momentum, sgd)")
