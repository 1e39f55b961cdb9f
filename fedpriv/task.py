"""The learning task shared by server and clients: dataset + model, built once per process.

``load_task(cfg)`` is cached on the parts of the config that define the task, so the in-process
backend builds the data once and every Flower worker process builds it once.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedpriv.data.federated import FederatedDataset
from fedpriv.errors import ConfigError
from fedpriv.models import build_model, get_flat_params
from fedpriv.training import LocalConfig


@dataclass
class Task:
    data: FederatedDataset
    client_model: nn.Module  # the replica clients train in this process
    eval_model: nn.Module  # the replica the server evaluates with
    initial_params: torch.Tensor
    local: LocalConfig
    seed: int


def load_dataset(data_cfg: Mapping[str, Any]) -> FederatedDataset:
    """Build the dataset named by ``data_cfg['name']`` (``synthetic`` or ``stackoverflow``)."""
    name = data_cfg.get("name")
    if name == "synthetic":
        from fedpriv.data.synthetic import SyntheticConfig, generate

        fields = dict(data_cfg.get("synthetic") or {})
        return generate(SyntheticConfig(seq_len=int(data_cfg.get("seq_len", 20)),
                                        seed=int(data_cfg.get("seed", 0)), **fields))
    if name == "stackoverflow":
        from fedpriv.data.stackoverflow import load_stackoverflow

        if not data_cfg.get("path"):
            raise ConfigError("data.path is not set: point it at TFF's stackoverflow.sqlite")
        return load_stackoverflow(
            data_cfg["path"], vocab_path=data_cfg.get("vocab_path"),
            vocab_size=int(data_cfg.get("vocab_size", 10000)), seq_len=int(data_cfg.get("seq_len", 20)),
            max_sentences_per_user=int(data_cfg.get("max_sentences_per_user", 256)),
            max_users=data_cfg.get("max_users"), max_test_sentences=int(data_cfg.get("max_test_sentences", 10000)),
            seed=int(data_cfg.get("seed", 0)), allow_private_vocab=bool(data_cfg.get("allow_private_vocab", False)))
    raise ConfigError(f"unknown dataset {name!r} (choose one of: stackoverflow, synthetic)")


def _model(model_cfg: Mapping[str, Any], data: FederatedDataset, seed: int) -> nn.Module:
    kwargs = {k: v for k, v in model_cfg.items() if k != "name"}
    if model_cfg.get("name") == "transformer":
        kwargs.setdefault("max_len", data.seq_len)
    torch.manual_seed(seed)
    return build_model(str(model_cfg.get("name")), data.vocab.size, pad_id=data.vocab.pad_id, **kwargs)


def task_key(cfg: Mapping[str, Any]) -> str:
    """The config parts that define the task, as a canonical JSON string."""
    return json.dumps({k: cfg.get(k) for k in ("data", "model", "client", "seed")}, sort_keys=True, default=str)


@functools.lru_cache(maxsize=2)
def _load_task(key: str) -> Task:
    cfg = json.loads(key)
    data = load_dataset(cfg["data"])
    seed = int(cfg["seed"])
    client_model = _model(cfg["model"], data, seed)
    eval_model = _model(cfg["model"], data, seed)
    client = cfg.get("client") or {}
    local = LocalConfig(epochs=int(client.get("epochs", 1)), batch_size=int(client.get("batch_size", 16)),
                        lr=float(client.get("lr", 0.5)), max_steps=client.get("max_steps"))
    return Task(data=data, client_model=client_model, eval_model=eval_model,
                initial_params=get_flat_params(client_model), local=local, seed=seed)


def load_task(cfg: Mapping[str, Any]) -> Task:
    """The process-wide task for ``cfg`` (a plain dict of the resolved config)."""
    return _load_task(task_key(cfg))
