"""The text side of a dataset, applied after it is loaded (``data.*`` config keys):

* ``public_source`` — the public corpus: ``embedded`` (the synthetic generator's, with hidden
  topics), ``c4`` / ``text`` (:mod:`fedpriv.text.corpora`, encoded with the dataset's word
  vocabulary), or ``none``;
* ``tokenizer`` — ``word`` (the dataset's word ids) or ``sentencepiece``: a SentencePiece model
  trained on the *public* sentences only; every private, test and public sentence is re-encoded
  with it into rows of ``sp_seq_len + 1`` subword ids. The test set keeps, per target position,
  the word it belongs to, so ``word_accuracy`` (a word counts only if all its tokens are right)
  compares tokenizers on the same words; ``hf``: a local Hugging Face tokenizer
  (``tokenizer_path``, by default the ``public.teacher_path`` of ``public.teacher=hf``), so the
  student and the teacher share token ids (:mod:`fedpriv.public.hf`).

Private text never reaches a tokenizer's training: the word vocabulary is the dataset's (public
for synthetic; TFF's word counts for StackOverflow), SentencePiece sees only the public corpus.

A loader may encode its splits with the subword tokenizer itself (``data=files``, which has no word
vocabulary to go through: :func:`subword_tokenizer`, SentencePiece trained on the raw normalised
public sentences): its dataset then carries the ``tokenizer``, and this pipeline re-encodes nothing,
only adds the public corpus, encoded with that tokenizer.

Whether the tokenizer fits the data is measured on the held-out **test** split only (its metrics
are published anyway; the training users' text is never looked at): ``test_unknown_share`` is the
share of its words that reach the model as no known token. Every test word unknown is refused
(the model could learn only the unknown token, which the accuracy leaves out); above
:data:`UNKNOWN_WARN` a ``warning:`` line says so.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from fedpriv import schema
from fedpriv.data.federated import FederatedDataset, PublicCorpus, Vocabulary
from fedpriv.errors import ConfigError
from fedpriv.schema import TextPipeline
from fedpriv.text.corpora import public_texts
from fedpriv.text.hf_tokenizer import HFTokenizer
from fedpriv.text.tokenizers import (SentencePieceTokenizer, Tokenizer, WordTokenizer, encode_rows, rows_to_texts,
                                     unknown_word_share)

log = logging.getLogger(__name__)

# a share of unknown test words above this is warned about: a vocabulary or tokenizer of the data's
# own language and domain leaves a few percent of its words unknown, never a quarter
UNKNOWN_WARN = 0.25
# what the model is told about the words, and the fix, per data.tokenizer
_TOKENIZER_FIX = {
    "word": ("the word vocabulary", "use a vocabulary counted on text like this data's (data.vocab_path, "
                                    "data.vocab_size)"),
    "sentencepiece": ("the SentencePiece model", "train it on a public corpus of this data's language "
                                                 "(data.public_source)"),
    "hf": ("the tokenizer of data.tokenizer_path", "give the tokenizer that belongs to this data's model "
                                                   "(data.tokenizer_path)"),
}


class RetokenizedUsers(Sequence):
    """``users[u]`` re-encoded on first access (the underlying users may themselves be lazy); the
    last ``cache_users`` users' encodings are kept, so a user sampled again is not re-encoded."""

    def __init__(self, users: Sequence[np.ndarray], vocab: Vocabulary, tokenizer: Tokenizer, seq_len: int,
                 cache_users: int = 4096) -> None:
        self.users, self.vocab, self.tokenizer, self.seq_len = users, vocab, tokenizer, seq_len
        self.cache_users = cache_users
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self.users)

    def __getitem__(self, u: int) -> np.ndarray:  # type: ignore[override]
        u = int(u)
        if u in self._cache:
            self._cache.move_to_end(u)
            return self._cache[u]
        rows = encode_rows(self.tokenizer, rows_to_texts(self.users[u], self.vocab), self.seq_len)[0]
        rows.setflags(write=False)  # shared by every later access
        self._cache[u] = rows
        if len(self._cache) > self.cache_users:
            self._cache.popitem(last=False)
        return rows


def _public_texts(spec: TextPipeline) -> list[str]:
    """The normalised sentences of the public source ``c4`` or ``text``."""
    return public_texts(spec.public_source, spec.public_path, spec.public_max_sentences, spec.public_text_field)


def _public_corpus(data: FederatedDataset, spec: TextPipeline) -> PublicCorpus | None:
    """The public corpus ``spec.public_source`` names, encoded with the dataset's tokenizer where
    its loader set one (``data=files`` under a subword tokenizer), else with its word vocabulary."""
    if spec.public_source == "none":
        return None
    if spec.public_source == "embedded":
        return data.public
    if data.tokenizer is not None:
        return PublicCorpus(sentences=encode_rows(data.tokenizer, _public_texts(spec), data.seq_len)[0])
    if data.vocab.words is None:
        raise ConfigError(f"data.public_source={spec.public_source} needs a dataset with a word vocabulary")
    rows, _ = encode_rows(WordTokenizer(data.vocab.words), _public_texts(spec), data.seq_len)
    return PublicCorpus(sentences=rows)


def subword_tokenizer(spec: TextPipeline, public: Sequence[str] | None) -> Tokenizer:
    """``sentencepiece``: trained here on the sentences ``public`` (the public corpus, never private
    text; None: the run has none); ``hf``: loaded from a local directory (``public`` unused)."""
    if spec.tokenizer == "hf":
        return HFTokenizer.load(spec.tokenizer_path)
    if public is None:
        raise ConfigError("data.tokenizer=sentencepiece trains on the public corpus, and this run has none "
                          "(set data.public_source)")
    return SentencePieceTokenizer.train(public, spec.sp_vocab_size, spec.sp_model_type)


def public_subword_tokenizer(spec: TextPipeline) -> Tokenizer:
    """The subword tokenizer of a dataset without a word vocabulary (``data=files``): SentencePiece
    trained on the raw normalised sentences of ``spec.public_source`` (c4 or text), or ``hf``'s."""
    has_text = spec.tokenizer == "sentencepiece" and spec.public_source in ("c4", "text")
    return subword_tokenizer(spec, _public_texts(spec) if has_text else None)


def token_seq_len(spec: TextPipeline, word_seq_len: int) -> int:
    """Subword tokens per row: ``data.sp_seq_len``, else twice the word ``seq_len``."""
    return spec.sp_seq_len or 2 * word_seq_len


def token_vocabulary(tok: Tokenizer) -> Vocabulary:
    """The id layout of a subword tokenizer (no words)."""
    return Vocabulary(size=tok.size, bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id, oov_id=tok.oov_id)


def _subword_tokenizer(data: FederatedDataset, spec: TextPipeline) -> Tokenizer:
    """``sentencepiece``: trained here on the public sentences (word rows as text); ``hf``: loaded."""
    if spec.tokenizer == "hf":
        return subword_tokenizer(spec, None)
    public = None if data.public is None else rows_to_texts(data.public.sentences, data.vocab)
    return subword_tokenizer(spec, public)


def _retokenize(data: FederatedDataset, spec: TextPipeline) -> FederatedDataset:
    """Every split re-encoded with a subword tokenizer into rows of ``sp_seq_len + 1`` ids."""
    tok = _subword_tokenizer(data, spec)
    seq_len = token_seq_len(spec, data.seq_len)
    vocab = token_vocabulary(tok)
    test, test_word_of = encode_rows(tok, rows_to_texts(data.test, data.vocab), seq_len)
    public = None
    if data.public is not None:
        public = replace(data.public, sentences=encode_rows(tok, rows_to_texts(data.public.sentences, data.vocab),
                                                            seq_len)[0])
    return replace(data, vocab=vocab, seq_len=seq_len, users=RetokenizedUsers(data.users, data.vocab, tok, seq_len),
                   test=test, test_word_of=test_word_of, public=public, tokenizer=tok,
                   info={**data.info, "tokenizer": spec.tokenizer, "token_vocab_size": tok.size,
                         "token_seq_len": seq_len})


def apply_text_pipeline(data: FederatedDataset, spec: TextPipeline | Mapping[str, Any]) -> FederatedDataset:
    """``data`` with its public corpus chosen and, for ``tokenizer=sentencepiece``/``hf``, re-tokenized.
    ``spec``: the typed data option (a mapping is checked and completed by the schema first: its
    defaults are the ``data`` option its ``name`` selects, the default one when it names none)."""
    if isinstance(spec, Mapping):
        spec = schema.load("data", dict(spec))
    data = replace(data, public=_public_corpus(data, spec))
    if data.tokenizer is not None:  # encoded by its loader, which measured the test split's coverage
        return data
    return _with_test_coverage(data, data if spec.tokenizer == "word" else _retokenize(data, spec), spec.tokenizer)


def _with_test_coverage(words: FederatedDataset, data: FederatedDataset, tokenizer: str) -> FederatedDataset:
    """``data`` (``words`` re-encoded, or ``words`` itself) with ``test_unknown_share``
    (:func:`checked_unknown_share` of ``words.test`` as text, encoded by ``data.tokenizer`` or the word
    vocabulary)."""
    if words.vocab.words is None:
        return data
    encoder = data.tokenizer if data.tokenizer is not None else WordTokenizer(words.vocab.words)
    share = checked_unknown_share(encoder, rows_to_texts(words.test, words.vocab), tokenizer)
    return data if share is None else replace(data, test_unknown_share=share)


def checked_unknown_share(encoder: Tokenizer, test_texts: Sequence[str], tokenizer: str) -> float | None:
    """The share of the test split's words (``test_texts``) that reach the model as no known token
    when ``encoder`` (the ``data.tokenizer`` named ``tokenizer``) encodes them; None for no word.
    Every test word unknown is a :class:`ConfigError`; more than :data:`UNKNOWN_WARN` is a warning.
    Only the test split is read: its metrics are published, the training users' text is not looked at."""
    share = unknown_word_share(encoder, test_texts)
    if share is None:
        return None
    what, fix = _TOKENIZER_FIX.get(tokenizer, ("the tokenizer", "use one that fits the data"))
    if share >= 1.0:
        raise ConfigError(f"every word of the test split is unknown to {what}: a model could learn only the unknown "
                          f"token, which the accuracy leaves out (it would stay 0); {fix}")
    if share > UNKNOWN_WARN:
        log.warning(f"{share:.0%} of the test split's words are unknown to {what} (test_unknown_share, a statistic "
                    "of the test split, published like its metrics): the model learns to predict the unknown token, "
                    f"which the accuracy leaves out, so the loss can fall while the accuracy stays near 0; {fix}")
    return share


