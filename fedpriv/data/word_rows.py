"""TFF's word-level rows: word ids under a word vocabulary, one row per sentence, and the seeded
test subset. Shared by the loaders of word-level federated text (the StackOverflow sqlite file;
``data=files`` with a word-count vocabulary), so that the same sentences give the same rows.

A sentence of words ``w`` becomes ``[BOS] + ids(w[:seq_len]) + [EOS]``, truncated to ``seq_len + 1``
and padded with the pad id to ``seq_len + 1`` (the layout of TFF's StackOverflow task): a sentence
of ``seq_len`` words or more loses its EOS, as in TFF, which appends EOS only to shorter sentences.
A word the vocabulary does not hold is the OOV id. Words may be ``str`` or the UTF-8 ``bytes`` of
those strings (the sqlite file's tokens are bytes): the lookup of each kind maps a word to the same
id, so both give identical rows. (:func:`fedpriv.text.tokenizers.encode_rows` differs: it always keeps
EOS, for subword tokenizers.)

:func:`scored_positions` is the accuracy's mask (targets that are words) and :func:`constant_accuracy`
the accuracy of always predicting one word: the unigram baselines the loaders publish.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from fedpriv.text.vocabulary import Vocabulary

Word = TypeVar("Word", str, bytes)


def word_lookup(vocab: Vocabulary, kind: type[Word]) -> dict[Word, int]:
    """Each vocabulary word, as ``kind`` (``str``, or ``bytes``: UTF-8, surrogateescape), mapped to its id."""
    words = vocab.words or ()
    if kind is bytes:
        return {w.encode("utf-8", "surrogateescape"): i + 1 for i, w in enumerate(words)}  # type: ignore[misc]
    if kind is str:
        return {w: i + 1 for i, w in enumerate(words)}  # type: ignore[misc]
    raise TypeError(f"words are str or bytes, not {kind!r}")


def sentence_ids(words: Sequence[Word], lookup: Mapping[Word, int], vocab: Vocabulary, seq_len: int) -> list[int]:
    """``[BOS] + ids(words[:seq_len]) + [EOS]``, truncated then padded to ``seq_len + 1``."""
    ids = [vocab.bos_id, *(lookup.get(w, vocab.oov_id) for w in words[:seq_len]), vocab.eos_id]
    ids = ids[: seq_len + 1]
    return ids + [vocab.pad_id] * (seq_len + 1 - len(ids))


def sentence_rows(
    sentences: Iterable[Sequence[Word]], lookup: Mapping[Word, int], vocab: Vocabulary, seq_len: int
) -> np.ndarray:
    """One int64 row of ``seq_len + 1`` ids per sentence (a sentence: its words), shape ``[n, seq_len + 1]``."""
    ids = [sentence_ids(words, lookup, vocab, seq_len) for words in sentences]
    return np.array(ids, dtype=np.int64).reshape(len(ids), seq_len + 1)


def test_subset(n: int, limit: int, seed: int) -> np.ndarray:
    """Sorted positions of a uniform subset of ``min(n, limit)`` of ``n`` items, drawn with ``seed``
    (all ``n`` when ``n <= limit``), int64.

    ``np.sort(default_rng(seed).choice(n, limit, replace=False))``: the held-out subset is public
    (it only selects which test sentences are scored), so a seeded numpy draw is fine here; it is no
    randomness the privacy guarantee relies on. For a sorted array ``a`` of ``n`` items,
    ``a[test_subset(n, limit, seed)]`` is ``np.sort(default_rng(seed).choice(a, limit, replace=False))``
    (``Generator.choice(a, ...)`` is ``a[choice(len(a), ...)]``), the StackOverflow loader's draw.
    """
    if n > limit:
        return np.sort(np.random.default_rng(seed).choice(n, size=limit, replace=False)).astype(np.int64)
    return np.arange(n, dtype=np.int64)


def scored_positions(rows: np.ndarray, vocab: Vocabulary) -> np.ndarray:
    """Mask ``[N, L]`` of positions the accuracy counts: the target ``rows[:, 1:]`` is a word (not
    pad, OOV, EOS, BOS)."""
    tgt = rows[:, 1:]
    return ~np.isin(tgt, vocab.excluded_from_accuracy()) & (tgt != vocab.bos_id)


def constant_accuracy(word: int, rows: np.ndarray, vocab: Vocabulary) -> float:
    """Accuracy on ``rows`` of always predicting the id ``word`` (0.0 where no target is scored)."""
    mask = scored_positions(rows, vocab)
    return float((rows[:, 1:][mask] == word).mean()) if mask.any() else 0.0


test_subset.__test__ = False  # type: ignore[attr-defined]  # a library function, not a pytest test where imported
