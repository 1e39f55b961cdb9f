"""Token-id layout of every dataset and tokenizer, and the word-count files word vocabularies come from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
import os
from pathlib import Path

from fedpriv.errors import ConfigError


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


WORD_COUNT_ORIGIN = "word<TAB>count lines, most frequent first, counted on public text"


def read_word_counts(
    path: str | os.PathLike, size: int | None, key: str, *, origin: str = WORD_COUNT_ORIGIN
) -> list[str]:
    """The first ``size`` words (all for None) of a word-count file, in file order.

    The format is TFF's (its ``stackoverflow.word_count``): one ``word<TAB>count`` line per word,
    most frequent first, so the first V words are the V-word vocabulary; blank lines are skipped.
    The whole file is checked, not only its first ``size`` lines, so that a damaged or foreign file
    never becomes a vocabulary: a missing file, text that is not UTF-8, a line that is not a word and
    a non-negative integer count, a word listed twice, or no word at all is one :class:`ConfigError`
    line naming the config ``key`` that gave ``path`` (e.g. ``data.vocab_path``) and the file;
    ``origin`` says what the right file is and where it comes from.
    """
    if size is not None and size < 1:
        raise ValueError(f"size must be >= 1 or None, got {size}")
    path = Path(path)
    where = f"{key}={path}"
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise ConfigError(f"{where} {what}: it must be a word-count file ({origin})")
    damaged = f"({origin}; a damaged copy? get it again)"
    words: list[str] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as f:
        try:
            for number, line in enumerate(f, 1):
                fields = line.split()
                if not fields:
                    continue
                if len(fields) != 2 or not (fields[1].isascii() and fields[1].isdigit()):
                    raise ConfigError(f"{where} is not a word-count file: line {number} is not 'word<TAB>count' "
                                      f"{damaged}")
                if fields[0] in seen:
                    raise ConfigError(f"{where} is not a word-count file: line {number} repeats the word "
                                      f"{fields[0]!r}")
                seen.add(fields[0])
                words.append(fields[0])
        except UnicodeDecodeError:
            raise ConfigError(f"{where} is not a word-count file: it is not UTF-8 text {damaged}") from None
    if not words:
        raise ConfigError(f"{where} is not a word-count file: it lists no word")
    return words[:size]


def word_count_text(counts: Mapping[str, int], min_count: int = 1) -> str:
    """``counts`` in the format :func:`read_word_counts` reads (TFF's): one ``word<TAB>count`` line
    per word seen at least ``min_count`` times, most frequent first, ties in code-point order. A word
    with whitespace in it, or no word left, is a :class:`ConfigError`."""
    kept = sorted(((w, n) for w, n in counts.items() if n >= min_count), key=lambda wn: (-wn[1], wn[0]))
    if not kept:
        raise ConfigError(f"no word occurs {min_count} times or more: lower the minimum count")
    for word, _ in kept:
        if not word or len(word.split()) != 1 or word.strip() != word:
            raise ConfigError(f"{word!r} is not a word (a word-count line is one word, a tab and its count)")
    return "".join(f"{word}\t{n}\n" for word, n in kept)
