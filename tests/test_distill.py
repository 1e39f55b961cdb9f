"""Top-k teacher logits on disk and the distillation loss."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedpriv.errors import ConfigError
from fedpriv.models import build_model
from fedpriv.public.distill import TopKCorpus, distillation_loss, write_topk


def _teacher():
    torch.manual_seed(0)
    return build_model("transformer", 40, d_model=16, num_layers=1, num_heads=2, ff_dim=32, max_len=8)


def _rows(n=23):
    rows = np.random.default_rng(1).integers(1, 40, size=(n, 9))
    rows[:5, 6:] = 0
    return rows


def test_written_corpus_holds_the_teachers_topk(tmp_path):
    teacher, rows = _teacher(), _rows()
    write_topk(teacher, rows, k=5, out_dir=tmp_path / "c", shard_rows=10, batch_size=4)
    corpus = TopKCorpus(tmp_path / "c")
    assert len(corpus) == 23 and corpus.k == 5 and corpus.index["shards"] == [10, 10, 3]
    picks = [0, 9, 10, 22, 3]
    ids, values = corpus.get(picks)
    with torch.no_grad():
        top = torch.topk(teacher(torch.as_tensor(rows[picks, :-1])), 5, dim=-1)
    torch.testing.assert_close(values, top.values)
    assert torch.equal(ids, top.indices)


def test_existing_corpus_is_reused_and_a_new_teacher_rewrites(tmp_path):
    teacher, rows = _teacher(), _rows()
    write_topk(teacher, rows, k=3, out_dir=tmp_path / "c")
    stamp = (tmp_path / "c" / "ids_00000.npy").stat().st_mtime_ns
    write_topk(teacher, rows, k=3, out_dir=tmp_path / "c")
    assert (tmp_path / "c" / "ids_00000.npy").stat().st_mtime_ns == stamp
    with torch.no_grad():
        teacher.head.weight.add_(1.0)
    write_topk(teacher, rows, k=3, out_dir=tmp_path / "c")
    assert (tmp_path / "c" / "ids_00000.npy").stat().st_mtime_ns != stamp
    with pytest.raises(ConfigError, match="no distillation corpus"):
        TopKCorpus(tmp_path / "missing")


def test_distillation_loss_matches_the_formula():
    gen = torch.Generator().manual_seed(0)
    z_s = torch.randn(2, 3, 7, generator=gen)
    z_t = torch.randn(2, 3, 7, generator=gen)
    y = torch.tensor([[1, 2, 0], [3, 0, 0]])
    top = torch.topk(z_t, 4, dim=-1)
    beta, t = 0.7, 2.0
    got = distillation_loss(z_s, y, top.indices, top.values, beta, t)
    keep = y != 0
    hard = F.cross_entropy(z_s[keep], y[keep])
    p_t = torch.softmax(top.values[keep] / t, -1)
    log_p_s = torch.log_softmax(z_s[keep] / t, -1).gather(1, top.indices[keep])
    assert float(got) == pytest.approx(float(hard - beta * (p_t * log_p_s).sum(-1).mean()), rel=1e-6)
    assert float(distillation_loss(z_s, y, top.indices, top.values, 0.0, t)) == pytest.approx(float(hard))
    with pytest.raises(ConfigError, match="temperature"):
        distillation_loss(z_s, y, top.indices, top.values, beta, 0.0)


def test_full_k_soft_term_is_minimized_by_the_teacher():
    """With k = V the soft term is the cross-entropy to the teacher: lowest when the student is the teacher."""
    gen = torch.Generator().manual_seed(2)
    z_t = torch.randn(1, 4, 6, generator=gen)
    y = torch.ones(1, 4, dtype=torch.long)
    top = torch.topk(z_t, 6, dim=-1)
    same = distillation_loss(z_t, y, top.indices, top.values, 1.0, 1.0) - F.cross_entropy(z_t[0], y[0])
    student = z_t + torch.randn(1, 4, 6, generator=gen)
    soft_other = distillation_loss(student, y, top.indices, top.values, 1.0, 1.0) - F.cross_entropy(student[0], y[0])
    assert float(same) <= float(soft_other) + 1e-6
