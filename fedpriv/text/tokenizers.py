"""Tokenizers built from *public* text, and next-word accuracy for comparing them.

Id layout shared by both (TFF StackOverflow convention): pad 0, then the tokenizer's pieces or
words, OOV/unk, BOS, EOS. Rows are ``BOS t_1 ... t_k EOS PAD ...`` of length ``seq_len + 1``.

* :class:`WordTokenizer` — the top-k words of a corpus. Built from public text; building it from
  private text needs ``allow_private=True`` and logs a warning (the vocabulary itself then leaks
  private words, outside any DP guarantee).
* :class:`SentencePieceTokenizer` — a SentencePiece unigram/BPE model trained in memory on public
  text only (``train``); private text is only ever *encoded* with it.

:func:`encode_rows` returns, with the rows, the index of the word each target token belongs to,
so :func:`next_word_accuracy` can count a word correct only when all its tokens are predicted
correctly; with a word-level tokenizer it equals token accuracy on the same words.
"""

from __future__ import annotations

import io
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedpriv.text.vocabulary import Vocabulary
from fedpriv.errors import ConfigError

log = logging.getLogger(__name__)

PAD_ID = 0
NO_WORD = -1  # word index of targets that belong to no word (EOS, PAD)


@dataclass
class WordTokenizer:
    """Word ids 1..V for ``words``; OOV V+1, BOS V+2, EOS V+3; ``size`` = V + 4
    (:meth:`~fedpriv.data.federated.Vocabulary.of_words`)."""

    words: tuple[str, ...]
    pad_id = PAD_ID

    @classmethod
    def from_texts(cls, texts: Iterable[str], vocab_size: int, allow_private: bool = False,
                   private: bool = False) -> "WordTokenizer":
        """The ``vocab_size`` most frequent words (ties: first seen). ``private=True`` marks the
        texts as private data: refused unless ``allow_private`` (then a warning is logged)."""
        if vocab_size < 1:
            raise ConfigError(f"vocab_size must be >= 1, got {vocab_size}")
        if private:
            if not allow_private:
                raise ConfigError("a word vocabulary built from private text leaks private words outside the DP "
                                  "guarantee: build it from public text, or pass allow_private=True to accept that")
            log.warning("building the word vocabulary from PRIVATE text: the vocabulary itself is not covered by "
                        "the differential-privacy guarantee")
        counts = Counter(word for text in texts for word in text.split())
        return cls(tuple(word for word, _ in counts.most_common(vocab_size)))

    def __post_init__(self) -> None:
        self._index = {w: i + 1 for i, w in enumerate(self.words)}
        layout = Vocabulary.of_words(self.words)
        self.oov_id, self.bos_id, self.eos_id, self.size = layout.oov_id, layout.bos_id, layout.eos_id, layout.size

    def encode_word(self, word: str) -> list[int]:
        return [self._index.get(word, self.oov_id)]  # "<unk>" is in no vocabulary: OOV


class SentencePieceTokenizer:
    """A SentencePiece model (pad 0, unk 1, BOS 2, EOS 3, pieces 4..) held as serialized bytes."""

    pad_id, oov_id, bos_id, eos_id = 0, 1, 2, 3

    def __init__(self, model: bytes) -> None:
        import sentencepiece as spm  # lazy: data.tokenizer=sentencepiece only

        self.model = model
        self._sp = spm.SentencePieceProcessor(model_proto=model)
        self._pieces: dict[str, list[int]] = {UNKNOWN_WORD: [self.oov_id]}

    @classmethod
    def train(cls, public_texts: Iterable[str], vocab_size: int, model_type: str = "unigram",
              seed_sentences: int = 200_000) -> "SentencePieceTokenizer":
        """Train on public text only (in memory; nothing is written). ``model_type``: unigram | bpe."""
        import sentencepiece as spm  # lazy: data.tokenizer=sentencepiece only

        if model_type not in ("unigram", "bpe"):
            raise ConfigError(f"unknown SentencePiece model_type {model_type!r} (choose one of: bpe, unigram)")
        if vocab_size < 8:
            raise ConfigError(f"SentencePiece vocab_size must be >= 8, got {vocab_size}")
        buffer = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(list(public_texts)), model_writer=buffer, vocab_size=vocab_size,
                model_type=model_type, pad_id=0, unk_id=1, bos_id=2, eos_id=3, input_sentence_size=seed_sentences,
                shuffle_input_sentence=True, character_coverage=1.0, minloglevel=2, num_threads=1)
        except RuntimeError as err:
            raise ConfigError(f"SentencePiece training failed: {str(err).splitlines()[0]}") from err
        return cls(buffer.getvalue())

    @property
    def size(self) -> int:
        return self._sp.get_piece_size()

    def encode_word(self, word: str) -> list[int]:
        # a word is encoded as at the start of a sentence piece sequence: "▁word" (memoized)
        pieces = self._pieces.get(word)
        if pieces is None:
            pieces = self._pieces[word] = list(self._sp.encode(word))
        return pieces

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids])


Tokenizer = WordTokenizer | SentencePieceTokenizer  # or fedpriv.public.hf.HFTokenizer (same interface)


def encode_rows(tokenizer: Tokenizer, texts: Sequence[str], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows [N, seq_len+1] (``BOS tokens EOS PAD…``, tokens truncated to ``seq_len − 1`` so EOS
    fits) and the word index [N, seq_len] of every *target* position (``NO_WORD`` for EOS/PAD).
    A word cut by truncation is dropped whole, so every counted word has all its tokens."""
    rows = np.full((len(texts), seq_len + 1), tokenizer.pad_id, dtype=np.int64)
    word_of = np.full((len(texts), seq_len), NO_WORD, dtype=np.int64)
    for n, text in enumerate(texts):
        tokens: list[int] = []
        owners: list[int] = []
        for w, word in enumerate(text.split()):
            pieces = tokenizer.encode_word(word)
            if len(tokens) + len(pieces) > seq_len - 1:
                break
            tokens += pieces
            owners += [w] * len(pieces)
        rows[n, 0] = tokenizer.bos_id
        rows[n, 1:len(tokens) + 1] = tokens
        rows[n, len(tokens) + 1] = tokenizer.eos_id
        word_of[n, :len(owners)] = owners  # target position j predicts rows[n, j + 1]
    return rows, word_of


def next_word_accuracy(predicted: np.ndarray, rows: np.ndarray, word_of: np.ndarray,
                       excluded: Sequence[int] = ()) -> float:
    """Share of words whose every token is predicted correctly (``predicted`` [N, seq_len] is the
    model's argmax at each position; targets are ``rows[:, 1:]``). Words containing an
    ``excluded`` target id (e.g. OOV) are not counted, as in the StackOverflow convention."""
    targets = rows[:, 1:]
    correct = 0
    total = 0
    for n in range(len(rows)):
        for w in np.unique(word_of[n][word_of[n] != NO_WORD]):
            where = word_of[n] == w
            if np.isin(targets[n][where], excluded).any():
                continue
            total += 1
            correct += bool((predicted[n][where] == targets[n][where]).all())
    return correct / max(total, 1)


UNKNOWN_WORD = "<unk>"  # how a row's OOV token is written as text; every tokenizer maps it to its unk id


def unknown_word_share(tokenizer: Tokenizer, texts: Iterable[str]) -> float | None:
    """Share of the words of ``texts`` (whitespace-separated) that reach a model as no known token:
    written :data:`UNKNOWN_WORD` (outside the dataset's own word vocabulary), or encoded by
    ``tokenizer`` to no token at all or to pieces that include its unknown id (``oov_id``). None
    when ``texts`` hold no word. Each distinct word is encoded once."""
    return unknown_share_of_counts(tokenizer, Counter(word for text in texts for word in text.split()))


def unknown_share_of_counts(tokenizer: Tokenizer, counts: Mapping[str, int]) -> float | None:
    """:func:`unknown_word_share` of text whose words occur ``counts[word]`` times."""
    total = sum(counts.values())
    if not total:
        return None
    oov = getattr(tokenizer, "oov_id", None)

    def unknown(word: str) -> bool:
        if word == UNKNOWN_WORD:
            return True
        pieces = tokenizer.encode_word(word)
        return not pieces or (oov is not None and oov in pieces)

    return sum(n for word, n in counts.items() if unknown(word)) / total


def rows_to_texts(rows: np.ndarray, vocab) -> list[str]:
    """Word-id rows as text, one sentence per row (specials dropped, OOV → ``<unk>``); needs a
    :class:`~fedpriv.data.federated.Vocabulary` with ``words`` (the synthetic words are ``w<id>``)."""
    if vocab.words is None:
        raise ConfigError("this dataset's vocabulary has no words: it cannot be written as text")
    table = np.array(["", *vocab.words, *[""] * (vocab.size - len(vocab.words) - 1)], dtype=object)
    if vocab.oov_id is not None:
        table[vocab.oov_id] = UNKNOWN_WORD
    drop = {vocab.pad_id, vocab.bos_id, vocab.eos_id}
    return [" ".join(table[t] for t in row if t not in drop) for row in np.asarray(rows)]
