"""fedpriv.data.word_rows: TFF's word-level rows for str and bytes words alike, and the seeded test
subset (issue 53, step 1: shared by the StackOverflow loader and ``data=files``)."""

from __future__ import annotations

import numpy as np
import pytest

from fedpriv.data import word_rows
from fedpriv.data.word_rows import sentence_ids, sentence_rows, word_lookup
from fedpriv.text.vocabulary import Vocabulary

VOCAB = Vocabulary.of_words(["the", "café", "naïve", "日本", "x"])  # pad 0, words 1..5, OOV 6, BOS 7, EOS 8
BOS, EOS, OOV = 7, 8, 6
SENTENCES = [
    "the café is naïve",
    "日本 x the",
    "",
    "x x x x x x x",  # longer than seq_len: truncated, EOS lost
    "the café naïve 日本 x",  # exactly seq_len words: EOS lost too
    "Café THE cafe\u0301",  # case and another normal form of é are other words
]
EXPECTED = [
    [BOS, 1, 2, OOV, 3, EOS],
    [BOS, 4, 5, 1, EOS, 0],
    [BOS, EOS, 0, 0, 0, 0],
    [BOS, 5, 5, 5, 5, 5],
    [BOS, 1, 2, 3, 4, 5],
    [BOS, OOV, OOV, OOV, EOS, 0],
]
SEQ_LEN = 5


def test_str_and_bytes_words_give_identical_rows() -> None:
    as_str = [s.split() for s in SENTENCES]
    as_bytes = [s.encode("utf-8").split() for s in SENTENCES]
    by_str = sentence_rows(as_str, word_lookup(VOCAB, str), VOCAB, SEQ_LEN)
    by_bytes = sentence_rows(as_bytes, word_lookup(VOCAB, bytes), VOCAB, SEQ_LEN)
    np.testing.assert_array_equal(by_str, EXPECTED)
    np.testing.assert_array_equal(by_bytes, by_str)
    assert by_str.dtype == by_bytes.dtype == np.int64 and by_str.shape == (len(SENTENCES), SEQ_LEN + 1)
    # bytes that are not UTF-8 (sqlite holds any bytes): unknown either way, decoded as the file reader would
    junk = [[b"the", b"caf\xe9", b"\xff"]]
    decoded = [[w.decode("utf-8", "surrogateescape") for w in junk[0]]]
    assert sentence_ids(junk[0], word_lookup(VOCAB, bytes), VOCAB, SEQ_LEN) == [BOS, 1, OOV, OOV, EOS, 0]
    np.testing.assert_array_equal(sentence_rows(decoded, word_lookup(VOCAB, str), VOCAB, SEQ_LEN),
                                  sentence_rows(junk, word_lookup(VOCAB, bytes), VOCAB, SEQ_LEN))


def test_no_sentence_is_an_empty_array_of_the_row_width() -> None:
    rows = sentence_rows([], word_lookup(VOCAB, str), VOCAB, SEQ_LEN)
    assert rows.shape == (0, SEQ_LEN + 1) and rows.dtype == np.int64
    with pytest.raises(TypeError):
        word_lookup(VOCAB, int)


def test_the_stackoverflow_loader_makes_these_rows(tmp_path, monkeypatch) -> None:
    """The sqlite loader's users are :func:`sentence_rows` of their sentences' str words."""
    from fedpriv.data.stackoverflow import load_stackoverflow
    from tests.test_stackoverflow import ROWS, WORD_COUNTS, make_db

    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cache"))
    (tmp_path / "stackoverflow.word_count").write_text(WORD_COUNTS)
    data = load_stackoverflow(make_db(tmp_path / "stackoverflow.sqlite"), vocab_size=5, seq_len=6)
    lookup = word_lookup(data.vocab, str)
    for i, client in enumerate(data.users.client_ids):
        words = [text.split() for split, c, text in ROWS if split == "train" and c == client]
        np.testing.assert_array_equal(data.users[i], sentence_rows(words, lookup, data.vocab, 6))


@pytest.mark.parametrize("n, limit", [(31, 10), (1000, 7), (500, 499), (12, 12), (5, 100), (0, 3)])
def test_the_test_subset_is_the_stackoverflow_draw(n: int, limit: int) -> None:
    rng = np.random.default_rng(n)
    rowids = np.sort(rng.choice(10 * n + 1, size=n, replace=False)).astype(np.int64)  # sorted, with gaps
    for seed in range(5):
        got = word_rows.test_subset(n, limit, seed)
        assert got.dtype == np.int64 and len(got) == min(n, limit) and (np.diff(got) > 0).all()
        old = np.sort(np.random.default_rng(seed).choice(rowids, size=limit, replace=False)) if n > limit else rowids
        np.testing.assert_array_equal(rowids[got], old)
    if n > limit:
        assert not np.array_equal(word_rows.test_subset(n, limit, 0), word_rows.test_subset(n, limit, 1))
