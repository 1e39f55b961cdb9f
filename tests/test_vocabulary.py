"""fedpriv.text.vocabulary.read_word_counts: TFF's word-count format, the first V words, one-line
refusals that name the config key (issue 53, step 1: shared by StackOverflow and ``data=files``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedpriv.errors import ConfigError
from fedpriv.text.vocabulary import read_word_counts

WORD_COUNTS = "the\t90\nof\t80\n\ncafé\t70\na\t60\n"


def test_the_first_words_in_file_order(tmp_path: Path) -> None:
    path = tmp_path / "public.word_count"
    path.write_text(WORD_COUNTS, encoding="utf-8")
    assert read_word_counts(path, None, "data.vocab_path") == ["the", "of", "café", "a"]
    assert read_word_counts(str(path), 3, "data.vocab_path") == ["the", "of", "café"]
    assert read_word_counts(path, 10, "data.vocab_path") == ["the", "of", "café", "a"]  # fewer words than asked
    with pytest.raises(ValueError):
        read_word_counts(path, 0, "data.vocab_path")


@pytest.mark.parametrize("content, needle", [
    (None, "does not exist"),
    ("dir", "is a directory"),
    (b"the\t3\nof\tmany\n", "line 2 is not 'word<TAB>count'"),
    (b"the\t3\nof\t2\nthe\t1\n", "line 3 repeats the word 'the'"),
    (bytes(range(128, 256)) * 8, "it is not UTF-8 text"),
    (b"\n \n", "it lists no word"),
])
def test_a_refusal_is_one_line_naming_the_key_and_the_file(tmp_path: Path, content, needle: str) -> None:
    path = tmp_path / "vocab.txt"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=needle) as err:
        read_word_counts(path, 2, "data.vocab_path", origin="counted on public text by the CLI")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"data.vocab_path={path} ")


def test_the_whole_file_is_checked_not_only_its_first_lines(tmp_path: Path) -> None:
    path = tmp_path / "damaged.word_count"
    path.write_bytes(b"the\t9\nof\t8\n\x00\x01garbage\n")
    with pytest.raises(ConfigError, match="line 3 is not 'word<TAB>count'"):
        read_word_counts(path, 1, "data.vocab_path")


def test_the_stackoverflow_refusal_names_its_key_and_tff_file(tmp_path: Path) -> None:
    from fedpriv.data.stackoverflow import load_word_counts

    path = tmp_path / "stackoverflow.word_count"
    path.write_bytes(b"how\t3\nto\ttwo\n")
    with pytest.raises(ConfigError) as err:
        load_word_counts(path)
    assert str(err.value).startswith(f"data.vocab_path={path} is not a word-count file")
    assert "TFF's stackoverflow.word_count" in str(err.value)
