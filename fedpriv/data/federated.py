"""The in-memory form every federated dataset takes.

A sentence is stored as one row of ``seq_len + 1`` token ids: ``BOS w_1 ... w_k EOS PAD ...``
(truncated to ``seq_len`` words before BOS/EOS are added, as in TFF's StackOverflow
preprocessing). Models read ``x = row[:-1]`` and predict ``y = row[1:]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from fedpriv.text.vocabulary import Vocabulary


def rows_tensor(rows: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
    """A user's rows as an int64 tensor on ``device`` (a copy where ``rows`` is a read-only cached
    encoding: torch cannot share memory it may not write)."""
    return torch.as_tensor(rows if rows.flags.writeable else rows.copy(), dtype=torch.long, device=device)


@dataclass
class PublicCorpus:
    """Public (non-private) sentences; ``topics`` holds hidden labels where the generator knows them."""

    sentences: np.ndarray  # int64 [P, seq_len + 1]
    topics: np.ndarray | None = None  # int64 [P]
    private_topics: frozenset[int] = frozenset()  # topics that private users draw from


@dataclass
class FederatedDataset:
    """Per-user training sentences plus a pooled held-out test set."""

    name: str
    vocab: Vocabulary
    seq_len: int
    users: Sequence[np.ndarray]  # users[u]: int64 [n_u, seq_len + 1], n_u >= 1 (may be lazy)
    test: np.ndarray  # int64 [M, seq_len + 1]
    ceiling_accuracy: float | None = None  # Bayes-optimal next-token accuracy, where known
    unigram_accuracy: float | None = None  # accuracy of predicting the most frequent word
    # what the two reference accuracies are computed from: summary.json publishes them, so it must
    # be public or held-out data, never the training users' (no ledger entry covers those)
    reference_source: str | None = None
    public: PublicCorpus | None = None
    test_word_of: np.ndarray | None = None  # [M, seq_len]: word index of each test target (subword tokenizers)
    tokenizer: object | None = None  # the subword tokenizer every split was re-encoded with (None: word ids)
    # share of the test split's words the tokenizer (or word vocabulary) does not know: a statistic of
    # the held-out test split, published like its metrics (summary.json); None where not measured
    test_unknown_share: float | None = None
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.ceiling_accuracy is not None or self.unigram_accuracy is not None) and not self.reference_source:
            raise ValueError(f"dataset {self.name!r}: reference accuracies are published in summary.json, so the "
                             "loader must say what they are computed from (reference_source: public or held-out "
                             "data only, never the training users')")

    @property
    def num_users(self) -> int:
        return len(self.users)
