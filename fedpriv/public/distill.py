"""Distillation from a teacher LM's top-k logits, written once and reused by any student.

``write_topk`` runs the teacher over public rows and stores, for every position, the k largest
logits (ids int32, values float32) in shards of memory-mapped ``.npy`` files plus ``index.json``
(k, rows, shard sizes, sequence length, a teacher fingerprint). ``TopKCorpus`` reads them back
lazily. The student's loss (Hinton et al., restricted to the teacher's top k)::

    L = CE(z_S, y) + β · CE(softmax(z_T / t) over the top k, softmax(z_S / t))

averaged over non-pad target positions; the teacher distribution is renormalized over its top
k, and the student's log-probabilities are taken over the full vocabulary at those k ids.
Everything here touches public data only (no privacy cost).
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedpriv.release.atomic import write_atomic
from fedpriv.errors import ConfigError

INDEX = "index.json"


def teacher_fingerprint(model: nn.Module) -> str:
    """sha256 over the teacher's parameters: which teacher wrote a corpus."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


@torch.no_grad()
def write_topk(teacher: nn.Module, rows: np.ndarray, k: int, out_dir: str | Path, shard_rows: int = 4096,
               batch_size: int = 256) -> Path:
    """Write the teacher's top-``k`` logits at every position of ``rows`` [N, L] (inputs
    ``rows[:, :-1]``) to ``out_dir``; an existing complete corpus from the same teacher, k and
    rows is reused. Shards are written to temporary names and renamed, so a crash never leaves a
    corpus that looks complete."""
    out = Path(out_dir)
    if k < 1:
        raise ConfigError(f"distillation top-k must be >= 1, got {k}")
    rows = np.asarray(rows)
    fingerprint = teacher_fingerprint(teacher)
    rows_digest = hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest()
    index_path = out / INDEX
    if index_path.exists():
        index = json.loads(index_path.read_text())
        if (index.get("teacher"), index.get("k"), index.get("rows_sha256")) == (fingerprint, k, rows_digest):
            return out
    out.mkdir(parents=True, exist_ok=True)
    teacher.eval()
    shards = []
    for s, start in enumerate(range(0, len(rows), shard_rows)):
        part = torch.as_tensor(rows[start:start + shard_rows], dtype=torch.long)
        ids = np.empty((len(part), part.shape[1] - 1, k), dtype=np.int32)
        values = np.empty((len(part), part.shape[1] - 1, k), dtype=np.float32)
        for b in range(0, len(part), batch_size):
            logits = teacher(part[b:b + batch_size, :-1])
            top = torch.topk(logits, k, dim=-1)
            ids[b:b + batch_size] = top.indices.numpy()
            values[b:b + batch_size] = top.values.numpy()
        for name, array in ((f"ids_{s:05d}.npy", ids), (f"values_{s:05d}.npy", values)):
            buffer = io.BytesIO()
            np.save(buffer, array)
            write_atomic(out / name, buffer.getvalue())
        shards.append(len(part))
    index = {"k": k, "rows": int(len(rows)), "positions": int(rows.shape[1] - 1), "shards": shards,
             "teacher": fingerprint, "rows_sha256": rows_digest}
    write_atomic(index_path, json.dumps(index).encode())
    return out


class TopKCorpus:
    """Read-only view of a corpus written by :func:`write_topk` (shards memory-mapped)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not (self.path / INDEX).exists():
            raise ConfigError(f"no distillation corpus at {self.path} (missing {INDEX})")
        self.index = json.loads((self.path / INDEX).read_text())
        self.k = int(self.index["k"])
        self._ids = [np.load(self.path / f"ids_{s:05d}.npy", mmap_mode="r") for s in range(len(self.index["shards"]))]
        self._values = [np.load(self.path / f"values_{s:05d}.npy", mmap_mode="r")
                        for s in range(len(self.index["shards"]))]
        self._starts = np.cumsum([0] + list(self.index["shards"]))

    def __len__(self) -> int:
        return int(self.index["rows"])

    def get(self, rows: np.ndarray | list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [n, T, k] long, values [n, T, k] float) for the given row indices."""
        rows = np.asarray(rows, dtype=np.int64)
        shard = np.searchsorted(self._starts, rows, side="right") - 1
        ids = np.stack([self._ids[s][r - self._starts[s]] for s, r in zip(shard, rows)])
        values = np.stack([self._values[s][r - self._starts[s]] for s, r in zip(shard, rows)])
        return torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(values)


def distillation_loss(student_logits: torch.Tensor, targets: torch.Tensor, topk_ids: torch.Tensor,
                      topk_values: torch.Tensor, beta: float, temperature: float, pad_id: int = 0) -> torch.Tensor:
    """``CE(z_S, y) + β · CE(softmax(z_T/t)|top-k, softmax(z_S/t))`` over non-pad targets.

    ``student_logits`` [B, T, V], ``targets`` [B, T], ``topk_ids``/``topk_values`` [B, T, k].
    """
    if temperature <= 0:
        raise ConfigError(f"distillation temperature must be > 0, got {temperature}")
    keep = targets != pad_id
    z = student_logits[keep]  # [N, V]
    hard = F.cross_entropy(z, targets[keep])
    if beta == 0:
        return hard
    teacher = torch.softmax(topk_values[keep] / temperature, dim=-1)  # [N, k]
    student = torch.log_softmax(z / temperature, dim=-1).gather(1, topk_ids[keep])  # [N, k]
    soft = -(teacher * student).sum(-1).mean()
    return hard + beta * soft


class TopKSubset:
    """The rows ``selected`` of a top-k corpus, re-indexed 0..len(selected)−1."""

    def __init__(self, corpus: TopKCorpus, selected: np.ndarray) -> None:
        self.corpus, self.selected, self.k = corpus, np.asarray(selected), corpus.k

    def get(self, rows) -> tuple[torch.Tensor, torch.Tensor]:
        return self.corpus.get(self.selected[np.asarray(rows)])
