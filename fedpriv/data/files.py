"""``data=files``: your own federated text — JSON Lines, JSON, CSV, Parquet or a ``datasets``
``save_to_disk`` directory with a user column, or ``.txt`` files of one user each — as a
:class:`FederatedDataset`, meeting the same contract as the StackOverflow file and the synthetic corpus.

Reading (:mod:`fedpriv.data.files_source`: offline, converted to Arrow once and cached by content,
never written next to the data) and the per-user index (:mod:`fedpriv.data.files_index`) are shared
with ``python -m fedpriv.data inspect``; this module makes the dataset of them.

**Users.** The train users are the index's users in sorted id order (code-point order for string
ids, numeric for integer ids) less those the public rule holds out for the test set (below), the
first ``max_users`` of them; user ``i``'s number among the train users is its partition id under
Flower Datasets' ``NaturalIdPartitioner(partition_by=user_column)`` on the train rows. They are
read when a cohort samples them (:class:`FilesUsers`): a user's first ``max_sentences_per_user``
sentences, its rows in file order. Every read checks that each row gathered holds the user's id
(and, under a split column, ``train``): a cache entry that is well-formed but wrong never mixes
users or trains on a test row.

**Test split.** With ``split_column``, rows whose value is ``train`` are trained on, ``test``
evaluated, any other ignored (a user may have rows on both sides, as in TFF's split by date); a
``DatasetDict``'s ``train`` and ``test`` splits likewise. Without either, whole users are held out by
:func:`fedpriv.data.files_index.split_of` — a keyed hash of the user id with ``test_fraction`` and
``split_seed``, public and independent of the data — so no test user is ever trained on. The test
set is a uniform subset of ``max_test_sentences`` test rows (seeded with ``data.seed``), then of
their sentences; a run with no test row is refused (there would be nothing to evaluate on).

**Sentences.** ``preprocess=tff``: a row's text is split into sentences (after ``. ! ?`` and at line
breaks) and normalised as the public corpora are (:func:`fedpriv.text.corpora.sentences`: lower case,
punctuation as tokens), so word counts made from public text by the same normaliser match;
``none``: a row is one sentence of whitespace-separated words, as TFF's StackOverflow ``tokens``.

**Tokenization from public things only.** ``tokenizer=word``: the first ``vocab_size`` words of the
word-count file ``vocab_path`` (TFF's format, counted on public text), rows laid out as TFF's
(:mod:`fedpriv.data.word_rows`: the same sentences give the StackOverflow loader's rows);
``sentencepiece``: a model trained on the public corpus (``public_source=c4|text``) only; ``hf``: a
local Hugging Face tokenizer. A run given none of them is refused when its config is parsed (before
anything is written): no default vocabulary fits a user's text, and one counted on the users' own
text would be private (it is not offered). Under a subword tokenizer this loader encodes every split
itself (the text pipeline re-encodes nothing: :mod:`fedpriv.data.text_pipeline`).

**References.** Under ``tokenizer=word`` the unigram baseline is the word-count file's most frequent
word (id 1) scored on the test rows: public, so the degradation check can say "below unigram" (the
run whose loss fell while its accuracy stayed 0). The population is the train users' count, which
is private under add/remove-one: ``public_population`` is None, so ``plan=auto`` needs
``population=N``, as for StackOverflow.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import numpy as np

from fedpriv.release.atomic import write_atomic
from fedpriv.cache import cache_root
import fedpriv.data.files_source as files_source
import fedpriv.data.word_rows as word_rows
from fedpriv.data.federated import FederatedDataset, Vocabulary
from fedpriv.data.files_index import UserIndex, split_of, user_index
from fedpriv.data.files_source import TEST, TRAIN, FilesSource, open_source
from fedpriv.data.lazy_users import LazyUsers
from fedpriv.data.text_pipeline import checked_unknown_share, public_subword_tokenizer, token_seq_len, token_vocabulary
from fedpriv.errors import ConfigError
from fedpriv.schema import LOCATION, TextPipeline, in_unit_interval, positive, register_option
from fedpriv.text import corpora
from fedpriv.text.tokenizers import Tokenizer, WordTokenizer, encode_rows, rows_to_texts
from fedpriv.text.vocabulary import read_word_counts

advice = logging.getLogger("fedpriv.advice")  # fedpriv.release.console.ADVICE_LOGGER: on stderr, never among results

NAME = "files"
# the refusal of a run with no public tokenization (one line, naming every way to give one)
NO_PUBLIC_TOKENIZATION = (
    "data=files needs a public vocabulary or tokenizer: data.vocab_path=WORD_COUNT_FILE (word<TAB>count lines, "
    "most frequent first, counted on public text: python -m fedpriv.data word-counts PUBLIC_TEXT -o FILE; with "
    "data.vocab_size), data.tokenizer=sentencepiece with "
    "data.public_source=text data.public_path=PUBLIC_TEXT (or c4: trained on that public text only), or "
    "data.tokenizer=hf data.tokenizer_path=DIR; none is made from your users' own text, which would not be private")


# ---------------------------------------------------------------------------------------------
# What is read, and how
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """The keys that decide which rows are read and how they become sentences (a pickle carries
    this, never the open dataset or the index)."""

    path: str
    user_column: str
    text_column: str
    split_column: str | None
    test_fraction: float
    split_seed: int
    max_users: int | None
    preprocess: str  # "tff" | "none"

    def sentences(self, text: str) -> list[str]:
        """A row's sentences, each its words separated by single spaces (the module docstring)."""
        if self.preprocess == "tff":
            return corpora.sentences(text)
        return [" ".join(text.split())]


@dataclass(frozen=True, eq=False)
class Opened:
    """``data.path`` open in this process: the source, its user index, and the index numbers of the
    train users (``numbers[i]`` is train user ``i``) and of the test users (None under a split)."""

    source: FilesSource
    index: UserIndex
    numbers: np.ndarray  # int64
    test_users: np.ndarray | None  # int64; the rule's test users (split "users"), else None


def open_reading(reading: Reading) -> Opened:
    """Open ``data.path`` (the conversion and the index from the cache where they are there) and
    list the train users (the module docstring); refuses a run with no train user."""
    source = open_source(reading.path, reading.user_column, reading.text_column, reading.split_column)
    index = user_index(source)
    test_users = None
    if source.split == "users":
        is_test = split_of(index.ids, reading.test_fraction, reading.split_seed)
        numbers, test_users = np.flatnonzero(~is_test), np.flatnonzero(is_test)
        if not len(numbers):
            raise ConfigError(f"every user of {reading.path!r} falls in the test split (data.test_fraction="
                              f"{reading.test_fraction}): there is no one to train on; lower data.test_fraction")
    else:
        numbers = np.arange(len(index), dtype=np.int64)
    if reading.max_users is not None:
        numbers = numbers[:reading.max_users]
    return Opened(source=source, index=index, numbers=numbers.astype(np.int64), test_users=test_users)


def _column(values: Any) -> list:
    """A gathered column as a Python list (a ``save_to_disk`` dataset may carry a numpy format)."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _mismatch(opened: Opened, what: str) -> ConfigError:
    return ConfigError(f"the cached index of {opened.source.described} does not match its rows ({what}): remove "
                       f"{opened.source.entry} (it is rebuilt from the data) and run again")


# ---------------------------------------------------------------------------------------------
# Users, read when sampled
# ---------------------------------------------------------------------------------------------


def user_sentences(opened: Opened, reading: Reading, i: int, max_rows: int | None = None) -> list[str]:
    """Train user ``i``'s sentences, from its rows in file order (the first ``max_rows`` rows;
    None: all). Every row read is checked to hold the user's id (and, under a split column,
    ``train``); a user whose rows hold no word is a :class:`ConfigError`."""
    number = int(opened.numbers[i])
    user_id = opened.index.id_of(number)
    positions = opened.index.rows_of(number)
    got = opened.source.train[(positions if max_rows is None else positions[:max_rows]).tolist()]
    if any(u != user_id for u in _column(got[reading.user_column])):
        raise _mismatch(opened, f"a row read for user {i} holds another user id")
    if opened.source.split == "column" and any(s != TRAIN for s in _column(got[reading.split_column])):
        raise _mismatch(opened, f"a row read for user {i} is not a {TRAIN!r} row")
    sentences = [s for text in _column(got[reading.text_column]) for s in reading.sentences(text)]
    if not sentences:
        raise ConfigError(f"the rows of user {i} of {reading.path!r} hold no word after data.preprocess="
                          f"{reading.preprocess}: every user needs a sentence")
    return sentences


@dataclass(frozen=True)
class Encoding:
    """How sentences become rows: TFF's word rows under ``vocab`` (``tokenizer`` None), else the
    subword ``tokenizer``'s (:func:`fedpriv.text.tokenizers.encode_rows`), ``seq_len + 1`` ids each."""

    vocab: Vocabulary
    seq_len: int
    tokenizer: Tokenizer | None = None
    _lookup: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def rows(self, sentences: Sequence[str]) -> np.ndarray:
        if self.tokenizer is not None:
            return encode_rows(self.tokenizer, sentences, self.seq_len)[0]
        if not self._lookup:
            self._lookup.update(word_rows.word_lookup(self.vocab, str))
        return word_rows.sentence_rows((s.split() for s in sentences), self._lookup, self.vocab, self.seq_len)

    def test_unknown_share(self, sentences: Sequence[str], tokenizer: str) -> float | None:
        """The share of the evaluated test words that reach the model as no known token, as a run
        publishes it (``test_unknown_share``) and checks it
        (:func:`~fedpriv.data.text_pipeline.checked_unknown_share`: all unknown refused, above a
        quarter warned): under the word vocabulary, the words of the rows the run evaluates (cut to
        ``seq_len``); under a subword tokenizer, the words of the sentences."""
        if self.tokenizer is not None:
            return checked_unknown_share(self.tokenizer, sentences, tokenizer)
        encoder = WordTokenizer(self.vocab.words or ())
        return checked_unknown_share(encoder, rows_to_texts(self.rows(sentences), self.vocab), tokenizer)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_lookup": {}}  # rebuilt on first use: the pickle stays small

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


class FilesUsers(LazyUsers):
    """The train users of a ``data=files`` source, each read and encoded when sampled.

    ``users[i]`` is train user ``i``'s first ``max_sentences`` sentences (its rows in file order),
    an int64 array ``[n, seq_len + 1]`` (a fresh copy each time), read with ``dataset[positions]``.
    Each process opens the source and its index on its first read (milliseconds where they are
    cached; a process that loaded the data starts with its own open one) and checks that the
    content is the one loaded; a pickle carries the reading keys, the content key, the encoding and
    the count of users, never the index or the open dataset. A small LRU keeps the last
    ``cache_size`` users (:class:`~fedpriv.data.lazy_users.LazyUsers`).
    """

    def __init__(self, reading: Reading, columns_key: str, count: int, encoding: Encoding, max_sentences: int,
                 cache_size: int = 64, opened: Opened | None = None) -> None:
        self.reading = reading
        self.columns_key = columns_key
        self.count = count
        self.encoding = encoding
        self.max_sentences = max_sentences
        super().__init__(cache_size)
        if opened is not None:
            self._opened = opened

    def __len__(self) -> int:
        return self.count

    def _open(self) -> Opened:
        opened = open_reading(self.reading)
        if opened.source.columns_key != self.columns_key or len(opened.numbers) != self.count:
            raise ConfigError(f"data.path {self.reading.path!r} changed since this run loaded it (its content "
                              "differs): a run reads the same data throughout; start it again")
        return opened

    def _read(self, i: int) -> np.ndarray:
        # a row holds at least one sentence: the first max_sentences rows hold the first max_sentences sentences
        sentences = user_sentences(self._handle(), self.reading, i, max_rows=self.max_sentences)
        return self.encoding.rows(sentences[:self.max_sentences])

    def __repr__(self) -> str:
        return f"FilesUsers({self.reading.path!r}, {len(self)} users)"


# ---------------------------------------------------------------------------------------------
# The test set
# ---------------------------------------------------------------------------------------------


def _nothing_to_evaluate(opened: Opened, reading: Reading) -> ConfigError:
    where = f"{reading.path!r}"
    if opened.source.split == "column":
        why = f"no row has data.split_column {reading.split_column!r} = {TEST!r}"
    elif opened.source.split == "dict":
        why = f"it is a DatasetDict without a {TEST!r} split"
    else:
        why = (f"no user falls in the test split (data.test_fraction={reading.test_fraction} of the users, by the "
               "public rule on their ids); raise data.test_fraction, or give a data.split_column")
    return ConfigError(f"{where} has no test rows: there is nothing to evaluate on ({why})")


def held_out_sentences(opened: Opened, reading: Reading, limit: int, seed: int) -> list[str]:
    """The test set's sentences: a uniform subset of ``limit`` test rows (seeded with ``seed``, in
    file order), then of their sentences. Every row read is checked to be a test row: its split is
    ``test``, or its user is one the public rule holds out."""
    source, index = opened.source, opened.index
    if source.split == "column":
        ds, positions = source.train, np.asarray(index.test_rows, dtype=np.int64)
    elif source.split == "dict":
        ds = source.test
        positions = np.arange(0 if ds is None else len(ds), dtype=np.int64)
    else:
        ds = source.train
        users = opened.test_users if opened.test_users is not None else np.zeros(0, np.int64)
        positions = (np.sort(np.concatenate([index.rows_of(int(u)) for u in users])).astype(np.int64)
                     if len(users) else np.zeros(0, np.int64))
    if not len(positions):
        raise _nothing_to_evaluate(opened, reading)
    chosen = positions[word_rows.test_subset(len(positions), limit, seed)]
    got = ds[chosen.tolist()]
    if source.split == "column" and any(s != TEST for s in _column(got[reading.split_column])):
        raise _mismatch(opened, f"a test row drawn is not a {TEST!r} row")
    if source.split == "users" and not split_of(_column(got[reading.user_column]), reading.test_fraction,
                                                reading.split_seed).all():
        raise _mismatch(opened, "a test row drawn belongs to a train user")
    sentences = [s for text in _column(got[reading.text_column]) for s in reading.sentences(text)]
    if not sentences:
        raise ConfigError(f"the test rows of {reading.path!r} hold no word after data.preprocess={reading.preprocess}: "
                          "there is nothing to evaluate on")
    if len(sentences) > limit:
        sentences = [sentences[j] for j in word_rows.test_subset(len(sentences), limit, seed)]
    return sentences


# ---------------------------------------------------------------------------------------------
# The loader
# ---------------------------------------------------------------------------------------------


def _reference_source(split: str) -> str:
    where = "the held-out test users" if split == "users" else "the test rows"
    return f"the public word-count file's most frequent word (data.vocab_path), scored on {where}"


def encoding_of(spec: "FilesData") -> Encoding:
    """How the run ``spec`` encodes sentences (the module docstring): ``tokenizer=word``, the first
    ``vocab_size`` words of ``vocab_path`` in TFF's layout; else the public subword tokenizer, rows
    of ``sp_seq_len`` (or twice ``seq_len``) tokens."""
    spec.check_public_tokenization()
    if spec.tokenizer == "word":
        return Encoding(Vocabulary.of_words(read_word_counts(spec.vocab_path, spec.vocab_size, "data.vocab_path")),
                        spec.seq_len)
    tok = public_subword_tokenizer(spec)
    return Encoding(token_vocabulary(tok), token_seq_len(spec, spec.seq_len), tok)


def load_files(spec: "FilesData") -> FederatedDataset:
    """The dataset ``spec`` (a :class:`FilesData`) names (the module docstring). Bad input is one
    :class:`ConfigError` line; an unwritable cache one :class:`~fedpriv.errors.OutputError` line."""
    spec.check_public_tokenization()
    reading = spec.reading()
    opened = open_reading(reading)
    texts = held_out_sentences(opened, reading, spec.max_test_sentences, spec.seed)
    if opened.source.converted or opened.index.built_seconds is not None:
        advice.info("%s was read into Arrow and indexed by user once, cached by content in %s (owner-only: it holds "
                    "a copy of the users' text); later loads of the same content open it in place",
                    opened.source.described, cache_root() / "files")
    info: dict[str, Any] = {"path": reading.path, "format": files_source.DESCRIBED[opened.source.kind],
                            "split": opened.source.split, "preprocess": reading.preprocess,
                            "max_sentences_per_user": spec.max_sentences_per_user}
    encoding = encoding_of(spec)
    vocab, tok = encoding.vocab, encoding.tokenizer
    if tok is None:
        test, test_word_of, share = encoding.rows(texts), None, None  # the text pipeline measures the share
        unigram, reference = word_rows.constant_accuracy(1, test, vocab), _reference_source(opened.source.split)
        info.update(vocab_size=len(vocab.words or ()), vocab_source=str(spec.vocab_path))
    else:
        test, test_word_of = encode_rows(tok, texts, encoding.seq_len)
        share = encoding.test_unknown_share(texts, spec.tokenizer)
        unigram = reference = None
        info.update(tokenizer=spec.tokenizer, token_vocab_size=tok.size, token_seq_len=encoding.seq_len)
    users = FilesUsers(reading, opened.source.columns_key, len(opened.numbers), encoding, spec.max_sentences_per_user,
                       opened=opened)
    info.update(num_users=len(users), num_test=len(test))
    return FederatedDataset(name=NAME, vocab=vocab, seq_len=encoding.seq_len, users=users, test=test,
                            unigram_accuracy=unigram, reference_source=reference, test_word_of=test_word_of,
                            tokenizer=encoding.tokenizer, test_unknown_share=share, info=info)


# ---------------------------------------------------------------------------------------------
# A tiny instance (the contract tests)
# ---------------------------------------------------------------------------------------------

TINY_WORDS = tuple(f"w{i}" for i in range(1, 301))  # the synthetic datasets' words (model=hf's tiny tokenizer's)


def write_tiny_files(directory: str | os.PathLike) -> tuple[Path, Path]:
    """``rows.jsonl`` (16 users ``user00``..``user15``, 3 to 6 rows each of one or two sentences over
    :data:`TINY_WORDS`, rows shuffled: not grouped by user) and ``word_counts.txt`` (those words,
    most frequent first) under ``directory``; (rows, word counts). At ``test_fraction=0.1`` the public
    rule holds out 4 of the users, leaving 12 to train on."""
    import json  # lazy: only the tests' writer needs it

    out = Path(directory) / "files_tiny"
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)  # test data, not a guarantee's randomness
    weights = [1.0 / rank for rank in range(1, len(TINY_WORDS) + 1)]  # Zipf: w1 the most frequent

    def sentence() -> str:
        return " ".join(rng.choices(TINY_WORDS, weights, k=rng.randint(2, 7)))

    rows = [{"user": f"user{u:02d}", "text": "\n".join(sentence() for _ in range(rng.randint(1, 2)))}
            for u in range(16) for _ in range(rng.randint(3, 6))]
    rng.shuffle(rows)
    write_atomic(out / "rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    write_atomic(out / "word_counts.txt",
                 "".join(f"{w}\t{10_000 // rank}\n" for rank, w in enumerate(TINY_WORDS, 1)).encode())
    return out / "rows.jsonl", out / "word_counts.txt"


# --- the config option (fedpriv/schema/parser.py registers it with Hydra) --------------------------


@dataclass
class FilesData(TextPipeline):
    """Your own federated text: files with a user column (read offline through ``datasets``)."""

    name: str = NAME
    # a .jsonl/.json/.csv file (optionally .gz) or .parquet file, a glob or a directory of them, or a directory
    # written by datasets' save_to_disk (a DatasetDict's splits are the split); .txt files: one user per file
    # (columns file: its path relative to data.path, the user id; text: one row per non-empty line)
    path: Optional[str] = field(default=None, metadata=LOCATION)
    user_column: Optional[str] = None  # the column of each row's user id (required)
    text_column: Optional[str] = None  # the column of each row's text (required)
    # rows whose value here is train are trained on, test evaluated, any other ignored (null: hold out whole users)
    split_column: Optional[str] = None
    # without a split column: the share of users held out for the test set, by a public keyed hash of their id
    test_fraction: float = 0.1
    # the public salt of that hash (not the run's seed: runs of a sweep test on the same users)
    split_seed: int = 0
    # tokenizer=word: a word-count file counted on public text (word<TAB>count, most frequent first)
    vocab_path: Optional[str] = field(default=None, metadata=LOCATION)
    vocab_size: int = 10000  # most frequent words of vocab_path kept (the rest map to one unknown token)
    # tff: a row's text split into sentences and normalised as the public corpora are; none: one sentence of
    # whitespace-separated words per row (as TFF's StackOverflow tokens)
    preprocess: Literal["tff", "none"] = "tff"
    max_sentences_per_user: int = 256  # cap on each user's training sentences (its first, in file order)
    max_users: Optional[int] = None  # the first N train users in user-id order (null: all)
    max_test_sentences: int = 10000  # size of the uniform test subset

    def check(self, path: str) -> None:
        super().check(path)
        positive(self, "vocab_size", "max_sentences_per_user", "max_users", "max_test_sentences", path=path)
        in_unit_interval(self, "test_fraction", path, closed_right=False)  # 0: nothing to test; 1: no one to train
        split_of([], self.test_fraction, self.split_seed)  # the rule's own check of its keys
        if self.public_source == "embedded":
            raise ConfigError(f"{path}.public_source=embedded is the synthetic generator's corpus: data=files has "
                              "none (c4, text or none)")

    def check_run(self, spec) -> None:
        files_source.check_named(self.path, self.user_column, self.text_column, self.split_column)
        # model=hf with data.tokenizer=hf reads its own tokenizer when data.tokenizer_path is unset
        # (fedpriv.config.resolve)
        self.check_public_tokenization(getattr(spec.model, "path", None) if spec.model.name == "hf" else None)

    def check_public_tokenization(self, model_path: str | None = None) -> None:
        """Refuse a run with no public vocabulary or tokenizer (:data:`NO_PUBLIC_TOKENIZATION`)."""
        given = {"word": bool(self.vocab_path),
                 "sentencepiece": self.public_source in ("c4", "text"),
                 "hf": bool(self.tokenizer_path or model_path)}
        if not given.get(self.tokenizer, False):
            raise ConfigError(NO_PUBLIC_TOKENIZATION)

    def inert_fields(self) -> tuple[str, ...]:
        split = ("test_fraction", "split_seed") if self.split_column is not None else ()
        return split + (("vocab_path", "vocab_size") if self.tokenizer != "word" else ())

    def reading(self) -> Reading:
        files_source.check_named(self.path, self.user_column, self.text_column, self.split_column)
        return Reading(path=str(self.path), user_column=str(self.user_column), text_column=str(self.text_column),
                       split_column=self.split_column, test_fraction=float(self.test_fraction),
                       split_seed=int(self.split_seed), max_users=self.max_users, preprocess=self.preprocess)

    def example_overrides(self, directory) -> list[str]:
        """A generated, shuffled JSON Lines file of 16 users (12 train) and its word counts
        (:func:`write_tiny_files`)."""
        rows, counts = write_tiny_files(directory)
        return [f"data.path={rows}", "data.user_column=user", "data.text_column=text", f"data.vocab_path={counts}",
                "data.vocab_size=300", "data.seq_len=8"]

    def load_words(self) -> FederatedDataset:
        """The users' sentences from ``data.path`` (never downloaded): word ids, or the ids of the
        subword tokenizer it set (``data.tokenizer``)."""
        return load_files(self)


register_option("data", NAME, FilesData())
