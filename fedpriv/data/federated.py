"""The in-memory form every federated dataset takes.

A sentence is stored as one row of ``seq_len + 1`` token ids: ``BOS w_1 ... w_k EOS PAD ...``
(truncated to ``seq_len`` words before BOS/EOS are added, as in TFF's StackOverflow
preprocessing). Models read ``x = row[:-1]`` and predict ``y = row[1:]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Vocabulary:
    """Token-id layout. ``size`` is the model's vocabulary (all ids, specials included)."""

    size: int
    bos_id: int
    eos_id: int
    pad_id: int = 0
    oov_id: int | None = None
    words: tuple[str, ...] | None = None  # words[i] is id i+1 where known

    @classmethod
    def of_words(cls, words: Sequence[str]) -> "Vocabulary":
        """TFF's StackOverflow layout for V words (also the synthetic corpus' and
        :class:`~fedpriv.public.tokenizers.WordTokenizer`'s): pad 0, words 1..V, OOV V+1, BOS V+2, EOS V+3."""
        v = len(words)
        return cls(size=v + 4, bos_id=v + 2, eos_id=v + 3, pad_id=0, oov_id=v + 1, words=tuple(words))

    def excluded_from_accuracy(self) -> tuple[int, ...]:
        """Target ids the standard accuracy ignores: pad, OOV and EOS (BOS is never a target)."""
        ids = [self.pad_id, self.eos_id]
        if self.oov_id is not None:
            ids.append(self.oov_id)
        return tuple(ids)


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
    public: PublicCorpus | None = None
    test_word_of: np.ndarray | None = None  # [M, seq_len]: word index of each test target (subword tokenizers)
    tokenizer: object | None = None  # the subword tokenizer every split was re-encoded with (None: word ids)
    info: dict = field(default_factory=dict)

    @property
    def num_users(self) -> int:
        return len(self.users)

    def user_sizes(self) -> np.ndarray:
        return np.array([len(u) for u in self.users], dtype=np.int64)
