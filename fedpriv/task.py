"""The learning task shared by server and clients: dataset + model, built once per process.

``load_task(spec)`` is cached on the parts of the typed config that define the task, so the
in-process backend builds the data once and every Flower worker process builds it once.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fedpriv import schema
from fedpriv.round.algorithms import Algorithm, build_algorithm
from fedpriv.clipping import BookKeeping
from fedpriv.round.cohort_parallel import CohortTrainer
from fedpriv.data.federated import FederatedDataset
from fedpriv.data.text_pipeline import apply_text_pipeline
from fedpriv.devices import resolve_device
from fedpriv.models import get_flat_params
from fedpriv.round.training import LocalConfig

log = logging.getLogger(__name__)


@dataclass
class Task:
    """``units`` are what the server samples and clips: the users (federated algorithms) or the
    pooled examples (central ``dpsgd``)."""

    data: FederatedDataset
    units: Sequence[np.ndarray]
    client_model: nn.Module  # the replica clients train in this process
    eval_model: nn.Module  # the replica the server evaluates with
    initial_params: torch.Tensor
    local: LocalConfig
    algorithm: Algorithm  # privacy unit, local steps, batched rounds (fedpriv/round/algorithms.py)
    bk: BookKeeping | None = None  # hooks client_model when clients run example-level DP-SGD
    trainer: CohortTrainer | None = None  # cohort-parallel local training (client.parallel > 1)
    device: torch.device = torch.device("cpu")


def load_dataset(data_cfg: Mapping[str, Any]) -> FederatedDataset:
    """Build the dataset the ``data`` option selects (its typed config's ``load_words``), then its
    public corpus and tokenizer (:func:`~fedpriv.data.text_pipeline.apply_text_pipeline`)."""
    spec = schema.load("data", dict(data_cfg))
    return apply_text_pipeline(_load_words(spec), spec)


def _load_words(spec: schema.TextPipeline) -> FederatedDataset:
    """The users' sentences of the typed ``data`` option (its ``load_words``)."""
    return spec.load_words()


def _model(spec: schema.ModelOption, data: FederatedDataset, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return spec.build_model(data.vocab.size, data.vocab.pad_id, data.seq_len)


def _task_device(spec: schema.RunConfig) -> str:
    """``device``, except that ``device=auto`` with public stages (host memory only) is the host; an
    explicit cuda is refused there."""
    host_only = spec.public.pretrain_steps > 0 or spec.public.mid_training_round is not None
    return "cpu" if host_only and spec.device == "auto" else spec.device


def task_key(spec: schema.RunConfig) -> str:
    """The config parts that define the task, as a canonical JSON string."""
    key = {k: schema.as_dict(getattr(spec, k)) for k in ("data", "model", "client", "algorithm", "seed", "rounds")}
    key["device"] = _task_device(spec)
    key["privacy"] = {"accountant": spec.privacy.accountant}
    return json.dumps(key, sort_keys=True, default=str)


@dataclass(frozen=True)
class _Keyed:
    """A typed config under its :func:`task_key`: the task cache compares and hashes the key only."""

    key: str
    spec: schema.RunConfig = field(compare=False, hash=False)


def cohort_parallel(client: schema.Client, device: torch.device) -> bool:
    """Whether clients train in cohort-parallel chunks: ``client.parallel > 1`` on an accelerator,
    or on the CPU with ``client.parallel_on_cpu``. On the CPU the chunks measured 1.3–1.4× slower than
    the per-client loop (default experiment, StackOverflow-size round; docs/BENCHMARKS.md
    "Paper scale"), so the loop runs there, with one ``warning:`` line saying so."""
    if client.parallel <= 1:
        return False
    if device.type != "cpu" or client.parallel_on_cpu:
        return True
    log.warning(f"client.parallel={client.parallel} runs the per-client loop on the CPU, where cohort-parallel "
                 "chunks measured 1.3-1.4x slower (docs/BENCHMARKS.md); client.parallel_on_cpu=true runs them anyway")
    return False


@functools.lru_cache(maxsize=2)
def _load_task(keyed: _Keyed) -> Task:
    spec = keyed.spec  # only its task_key parts are read
    data = apply_text_pipeline(_load_words(spec.data), spec.data)
    device = resolve_device(_task_device(spec))
    client_model = _model(spec.model, data, spec.seed)
    initial_params = get_flat_params(client_model)  # the server's copy, in host memory
    client_model.to(device)
    eval_model = _model(spec.model, data, spec.seed).to(device)
    algorithm = build_algorithm(spec)
    client = spec.client
    local = algorithm.local_config(client, spec.rounds, spec.privacy.accountant)
    algorithm.check_model(client_model, spec.model.per_sample_alternative())  # the clients' engine, refused in one line
    algorithm.check_precision(client.precision)
    # the trainer's replica is copied before the engine hooks client_model
    trainer = (CohortTrainer(client_model, local, data.vocab.pad_id, client.parallel)
               if cohort_parallel(client, device) and algorithm.per_unit_deltas else None)
    bk = algorithm.client_engine(client_model, local)
    units = algorithm.units(data.users)
    return Task(data=data, units=units, bk=bk, client_model=client_model, eval_model=eval_model,
                initial_params=initial_params, local=local, algorithm=algorithm, trainer=trainer, device=device)


def load_task(spec: schema.RunConfig) -> Task:
    """The process-wide task of the run's typed config ``spec``."""
    return _load_task(_Keyed(task_key(spec), spec))
