"""Evaluation's batches are sized by a logits budget, so its memory does not grow with the
vocabulary (issue 31, item 5); the metrics do not depend on the batching."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fedpriv.metrics as metrics
from fedpriv.metrics import EVAL_ROWS, eval_batch_rows, evaluate
from fedpriv.models.lstm import LSTMLanguageModel
from fedpriv.text.vocabulary import Vocabulary


def test_batch_rows_follow_the_logits_budget():
    assert eval_batch_rows(20, 3004) == EVAL_ROWS  # the synthetic default: 256 rows, as before
    rows = eval_batch_rows(20, 10_004)  # StackOverflow's vocabulary
    assert rows == 83 and rows * 20 * 10_004 * 4 <= metrics.EVAL_LOGITS_BYTES < (rows + 1) * 20 * 10_004 * 4
    assert eval_batch_rows(20, 10**9) == 1  # never zero


def test_metrics_do_not_depend_on_the_batching(monkeypatch):
    torch.manual_seed(0)
    vocab = Vocabulary.of_words([f"w{k}" for k in range(40)])
    model = LSTMLanguageModel(vocab.size, embed_dim=8, hidden_size=16, projection_dim=8)
    gen = np.random.default_rng(0)
    rows = gen.integers(1, vocab.size, size=(37, 9))
    rows[:, 0] = vocab.bos_id
    rows[gen.random(rows.shape) < 0.2] = vocab.pad_id
    whole = evaluate(model, rows, vocab, batch_size=256)
    seen = []
    inner = metrics.target_logits

    def recording(model, batch, pad_id):
        seen.append(len(batch))
        return inner(model, batch, pad_id)

    monkeypatch.setattr(metrics, "target_logits", recording)
    monkeypatch.setattr(metrics, "EVAL_LOGITS_BYTES", 5 * 8 * vocab.size * 4)  # 5 rows of 8 positions
    small = evaluate(model, rows, vocab)
    assert seen == [5] * 7 + [2]
    assert small["accuracy"] == whole["accuracy"] and small["accuracy_with_specials"] == whole["accuracy_with_specials"]
    assert small["loss"] == pytest.approx(whole["loss"], rel=1e-6)
