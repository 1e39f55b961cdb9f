"""Token-id layout of every dataset and tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
        :class:`~fedpriv.text.tokenizers.WordTokenizer`'s): pad 0, words 1..V, OOV V+1, BOS V+2, EOS V+3."""
        v = len(words)
        return cls(size=v + 4, bos_id=v + 2, eos_id=v + 3, pad_id=0, oov_id=v + 1, words=tuple(words))

    def excluded_from_accuracy(self) -> tuple[int, ...]:
        """Target ids the standard accuracy ignores: pad, OOV and EOS (BOS is never a target)."""
        ids = [self.pad_id, self.eos_id]
        if self.oov_id is not None:
            ids.append(self.oov_id)
        return tuple(ids)
