"""What a run needs from public data, built once on the server side (never in client processes):
the embedded teacher and its top-k corpus (only when pre-training or mid-training uses them) and
the round-0 pre-trained initial model. Public data only: no privacy cost."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from fedpriv.cache import cache_root, load_entry, save_entry
from fedpriv.errors import ConfigError
from fedpriv.models import set_flat_params
from fedpriv.schema import Public
from fedpriv.public.distill import TopKCorpus, TopKSubset, teacher_fingerprint, write_topk
from fedpriv.public.hf import HFTeacher
from fedpriv.public.pretrain import pretrain
from fedpriv.public.teacher import embedded_teacher
from fedpriv.text.hf_tokenizer import HFTokenizer


@dataclass
class PublicArtifacts:
    initial_params: torch.Tensor  # the model round 1 starts from (pre-trained when asked)
    stats: dict = field(default_factory=dict)  # public pre-training statistics, if any
    teacher: nn.Module | None = None  # public.teacher=embedded
    topk: TopKCorpus | None = None  # the teacher's top-k logits for the public corpus


def _teacher(public: Public, data, seed: int) -> nn.Module | None:
    """The embedded teacher (trained on the public corpus, cached), a local Hugging Face LM
    (``hf``), or None for ``teacher=none``."""
    kind = public.teacher
    if kind == "none":
        return None
    if kind == "hf":
        if not isinstance(data.tokenizer, HFTokenizer):
            raise ConfigError("public.teacher=hf needs data.tokenizer=hf: the student must use the teacher's tokenizer")
        return HFTeacher.load(public.teacher_path, data.tokenizer)
    if data.public is None:
        raise ConfigError(f"public.teacher needs a public corpus; dataset {data.name!r} has none")
    return embedded_teacher(data.public.sentences, data.vocab.size, data.seq_len,
                            dataclasses.asdict(public.teacher_model), public.teacher_steps,
                            public.teacher_batch_size, public.teacher_lr,
                            seed, data.vocab.pad_id)


def _topk_corpus(teacher: nn.Module, public: Public, data) -> TopKCorpus:
    """The teacher's top-k logits for the whole public corpus, written once to the cache."""
    k = public.distill_k
    out = cache_root() / "distill" / f"{teacher_fingerprint(teacher)[:24]}-k{k}"
    return TopKCorpus(write_topk(teacher, data.public.sentences, k, out))


def pretrain_subset(pool: int, fraction: float, seed: int) -> np.ndarray:
    """The sorted rows of a public pool of ``pool`` sentences that pre-training may use: all of
    them, or a uniformly random ``ceil(fraction · pool)`` of them (seeded by the run seed)."""
    if fraction >= 1.0:
        return np.arange(pool)
    n = max(1, int(np.ceil(fraction * pool)))
    rng = np.random.default_rng(np.random.SeedSequence([seed, 23]))
    return np.sort(rng.choice(pool, size=n, replace=False))


PRETRAIN_CACHE_VERSION = 1


def _pretrained(public: Public, task, rows: np.ndarray, seed: int, teacher: nn.Module | None,
                topk: TopKCorpus | None) -> tuple[torch.Tensor, dict]:
    """:func:`~fedpriv.public.pretrain.pretrain` from the task's initial model on the public
    ``rows``, cached under ``$FEDPRIV_CACHE/pretrained`` keyed by everything it depends on (the
    initial model's and the rows' digests, the steps, batch, rate, seed, teacher and distillation
    settings, torch's version and thread count): a sweep over ε pre-trains once. Public data only;
    an entry of another key or shape is recomputed, never trusted."""
    data = task.data
    sentences = np.ascontiguousarray(data.public.sentences[rows])
    spec = {"init": hashlib.sha256(task.initial_params.detach().cpu().numpy().tobytes()).hexdigest(),
            "rows": hashlib.sha256(sentences.tobytes()).hexdigest(), "shape": list(sentences.shape),
            "steps": public.pretrain_steps, "batch": public.pretrain_batch_size, "lr": public.pretrain_lr,
            "seed": seed, "pad": data.vocab.pad_id,
            "teacher": None if teacher is None else teacher_fingerprint(teacher),
            "k": None if topk is None else topk.k, "beta": public.distill_beta,
            "temperature": public.distill_temperature, "version": PRETRAIN_CACHE_VERSION,
            # the float result of the same steps may differ across torch versions and thread counts
            "torch": torch.__version__, "threads": torch.get_num_threads()}
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    path = cache_root() / "pretrained" / f"{key[:24]}.pt"
    entry = load_entry(path, key)
    if (entry is not None and isinstance(entry.get("params"), torch.Tensor)
            and entry["params"].shape == task.initial_params.shape and isinstance(entry.get("stats"), dict)):
        return entry["params"], dict(entry["stats"])
    model = task.eval_model  # the server's replica; reset to the task's initial model first
    set_flat_params(model, task.initial_params)
    params, stats = pretrain(model, sentences, public.pretrain_steps, public.pretrain_batch_size, public.pretrain_lr,
                             seed, data.vocab.pad_id, topk=TopKSubset(topk, rows) if topk is not None else None,
                             beta=public.distill_beta, temperature=public.distill_temperature)
    save_entry(path, key, {"params": params.detach().clone(), "stats": stats})
    return params, stats


def prepare_public(public: Public, task, seed: int) -> PublicArtifacts:
    """Teacher, top-k corpus and initial model for ``task`` (``public``: the run's typed section);
    the teacher is built only when pre-training or mid-training will use it."""
    data = task.data
    pretrain_steps = public.pretrain_steps
    used = pretrain_steps > 0 or public.mid_training_round is not None
    if used and getattr(task, "device", torch.device("cpu")).type != "cpu":
        raise ConfigError("public-data pre-training, distillation and mid-training run in host memory only: "
                          "use device=cpu for runs with public stages")
    teacher = _teacher(public, data, seed) if used else None
    topk = _topk_corpus(teacher, public, data) if teacher is not None else None
    out = PublicArtifacts(initial_params=task.initial_params, teacher=teacher, topk=topk)
    if pretrain_steps > 0:
        if data.public is None:
            raise ConfigError(f"public.pretrain_steps needs a public corpus; dataset {data.name!r} has none")
        rows = pretrain_subset(len(data.public.sentences), public.pretrain_fraction, seed)
        out.initial_params, out.stats = _pretrained(public, task, rows, seed, teacher, topk)
        out.stats["public_pool"] = float(len(rows))
        if topk is not None:
            out.stats["distill_k"] = float(topk.k)
    return out
