"""Public tokenizers: SentencePiece trained on public text, word vocabularies, next-word accuracy."""

import logging

import numpy as np
import pytest

from fedpriv.data.synthetic import SyntheticConfig, generate
from fedpriv.errors import ConfigError
from fedpriv.text.tokenizers import (NO_WORD, UNKNOWN_WORD, SentencePieceTokenizer, WordTokenizer, encode_rows,
                                       next_word_accuracy, rows_to_texts, unknown_word_share)


@pytest.fixture(scope="module")
def public_texts():
    data = generate(SyntheticConfig(num_users=40, vocab_size=300, num_test=100, num_public=500))
    return rows_to_texts(data.public.sentences, data.vocab)


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_trained_on_public_text_round_trips(public_texts, model_type):
    sp = SentencePieceTokenizer.train(public_texts, 80, model_type=model_type)
    assert sp.size == 80
    for text in public_texts[:20]:
        ids = [i for w in text.split() for i in sp.encode_word(w)]
        assert sp.decode(ids) == text
        assert min(ids) >= 4  # pieces never collide with pad/unk/bos/eos


def test_sentencepiece_bad_settings_are_config_errors(public_texts):
    with pytest.raises(ConfigError, match="model_type"):
        SentencePieceTokenizer.train(public_texts, 80, model_type="wordpiece")
    with pytest.raises(ConfigError, match="training failed"):
        SentencePieceTokenizer.train(public_texts, 5000)


def test_word_vocabulary_from_private_text_needs_the_flag(caplog):
    texts = ["a b b c", "b c"]
    assert WordTokenizer.from_texts(texts, 2).words == ("b", "c")
    with pytest.raises(ConfigError, match="leaks private words"):
        WordTokenizer.from_texts(texts, 2, private=True)
    with caplog.at_level(logging.WARNING):
        WordTokenizer.from_texts(texts, 2, private=True, allow_private=True)
    assert any("PRIVATE" in r.message for r in caplog.records)


def test_encode_rows_layout_and_word_index():
    tok = WordTokenizer(("x", "y"))
    rows, word_of = encode_rows(tok, ["x y z x", "y"], seq_len=4)
    # "x y z" fit (3 = seq_len - 1 tokens), the 4th word is cut; z is OOV
    np.testing.assert_array_equal(rows[0], [tok.bos_id, 1, 2, tok.oov_id, tok.eos_id])
    np.testing.assert_array_equal(word_of[0], [0, 1, 2, NO_WORD])
    np.testing.assert_array_equal(rows[1], [tok.bos_id, 2, tok.eos_id, 0, 0])


def test_next_word_accuracy_needs_every_token_of_a_word():
    rows = np.array([[2, 10, 11, 12, 3]])  # BOS, word 0 = tokens 10 11, word 1 = token 12, EOS
    word_of = np.array([[0, 0, 1, NO_WORD]])
    assert next_word_accuracy(np.array([[10, 11, 12, 3]]), rows, word_of) == 1.0
    assert next_word_accuracy(np.array([[10, 99, 12, 3]]), rows, word_of) == 0.5  # word 0 half right: wrong
    assert next_word_accuracy(np.array([[10, 11, 99, 3]]), rows, word_of, excluded=(12,)) == 1.0


def test_word_level_next_word_accuracy_equals_token_accuracy(public_texts):
    tok = WordTokenizer.from_texts(public_texts, 50)
    rows, word_of = encode_rows(tok, public_texts[:50], seq_len=20)
    rng = np.random.default_rng(0)
    predicted = np.where(rng.random(rows[:, 1:].shape) < 0.5, rows[:, 1:], 0)
    scored = word_of != NO_WORD
    token_acc = (predicted == rows[:, 1:])[scored].mean()
    assert next_word_accuracy(predicted, rows, word_of) == pytest.approx(token_acc)


def test_unknown_word_share_counts_unknown_and_vanishing_words():
    tok = WordTokenizer(("a", "b"))
    assert unknown_word_share(tok, ["a b c", f"{UNKNOWN_WORD} a"]) == pytest.approx(2 / 5)

    class EncodesNothing:  # an empty tokenizer: every word vanishes
        oov_id = None

        def encode_word(self, word):
            return []

    assert unknown_word_share(EncodesNothing(), ["a b"]) == 1.0
    assert unknown_word_share(tok, ["", " "]) is None
