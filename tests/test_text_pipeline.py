"""Public corpora (C4 shards, local text/JSON) and the tokenizer pipeline, on fixtures the tests write."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedpriv.data import text_pipeline
from fedpriv.data.federated import FederatedDataset
from fedpriv.data.synthetic import SyntheticConfig, generate
from fedpriv.data.text_pipeline import apply_text_pipeline
from fedpriv.errors import ConfigError
from fedpriv.metrics import evaluate
from fedpriv.models import build_model
from fedpriv.text.corpora import normalize, public_texts, sentences
from fedpriv.text.tokenizers import SentencePieceTokenizer, WordTokenizer, encode_rows, rows_to_texts
from fedpriv.task import load_dataset
from tests.conftest import compose_cfg
from tests.test_stackoverflow import WORD_COUNTS, make_db

@pytest.fixture(scope="module")
def small_words():
    return generate(SyntheticConfig(num_users=30, vocab_size=200, num_test=150, num_public=400, topic_words=50,
                                    seed=1))


DOCS = ["How to sort a list? I do it.\nSort it again!", "A list of 5 items, in Python's style."]


def write_c4_shard(path: Path, docs=DOCS) -> Path:
    """A shard in the layout of allenai/c4 realnewslike: gzipped JSON lines {text, timestamp, url}."""
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for n, doc in enumerate(docs):
            f.write(json.dumps({"text": doc, "timestamp": "2019-04-25T10:00:00Z", "url": f"https://x/{n}"}) + "\n")
    return path


def test_normalize_and_sentence_split():
    assert normalize("It's 5 p.m., OK?") == "it's 5 p . m . , ok ?"
    assert sentences(DOCS[0]) == ["how to sort a list ?", "i do it .", "sort it again !"]


def test_c4_source_streams_local_shards_through_datasets(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    shard = write_c4_shard(tmp_path / "c4-train.00000-of-00512.json.gz")
    texts = public_texts("c4", shard, max_sentences=100)
    assert texts == [*sentences(DOCS[0]), *sentences(DOCS[1])]
    assert public_texts("c4", tmp_path, max_sentences=2) == texts[:2]  # a directory, and the cap
    assert public_texts("c4", str(tmp_path / "c4-train.*.json.gz"), max_sentences=100) == texts  # a glob


def test_text_source_reads_txt_and_jsonl(tmp_path):
    (tmp_path / "a.txt").write_text(DOCS[0] + "\n\n")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write(json.dumps({"body": DOCS[1]}) + "\n")
    texts = public_texts("text", tmp_path, max_sentences=100, text_field="body")
    assert texts == [*sentences(DOCS[0]), *sentences(DOCS[1])]  # files in sorted order, one document per line


def test_bad_public_sources_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no public text files"):
        public_texts("text", tmp_path / "missing", 10)
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: not a JSON object"):
        public_texts("text", tmp_path / "bad.jsonl", 10)
    (tmp_path / "nofield.jsonl").write_text('{"body": "ok"}\n')
    with pytest.raises(ConfigError, match="no string field 'text'"):
        public_texts("text", tmp_path / "nofield.jsonl", 10)
    with pytest.raises(ConfigError, match="needs data.public_path"):
        public_texts("text", None, 10)


def test_bad_pipeline_settings_are_config_errors(small_words):
    with pytest.raises(ConfigError, match="unknown data.public_source"):
        apply_text_pipeline(small_words, {"public_source": "wiki"})
    with pytest.raises(ConfigError, match="unknown data.tokenizer"):
        apply_text_pipeline(small_words, {"tokenizer": "bytes"})


def test_stackoverflow_with_c4_public_corpus(tmp_path, monkeypatch):
    """The public corpus is encoded with the StackOverflow word vocabulary (OOV for other words)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    (tmp_path / "stackoverflow.word_count").write_text(WORD_COUNTS)
    db = make_db(tmp_path / "stackoverflow.sqlite")
    shard = write_c4_shard(tmp_path / "c4-train.00000-of-00512.json.gz")
    cfg = compose_cfg("data=stackoverflow", f"data.path={db}", "data.vocab_size=5", "data.seq_len=6",
                      "data.public_source=c4", f"data.public_path={shard}", run_dir=tmp_path / "r")["data"]
    data = load_dataset(cfg)
    # ids: i=1 how=2 to=3 a=4 list=5, OOV 6, BOS 7, EOS 8; "how to sort a list ?" -> how to OOV a list (OOV cut)
    np.testing.assert_array_equal(data.public.sentences[0], [7, 2, 3, 6, 4, 5, 8])
    np.testing.assert_array_equal(data.public.sentences[1], [7, 1, 6, 6, 6, 8, 0])  # "i do it ."
    assert data.public.topics is None and len(data.public.sentences) == 4
    assert load_dataset({**cfg, "public_source": "none"}).public is None


def test_sentencepiece_pipeline_reencodes_every_split_from_public_training(small_words):
    data = apply_text_pipeline(small_words, {"tokenizer": "sentencepiece", "sp_vocab_size": 60, "sp_seq_len": 30})
    assert data.vocab.size == 60 and data.seq_len == 30 and data.info["tokenizer"] == "sentencepiece"
    assert data.test.shape == (150, 31) and data.test_word_of.shape == (150, 30)
    assert data.public.sentences.shape == (400, 31)
    np.testing.assert_array_equal(data.public.topics, small_words.public.topics)  # labels kept in order
    assert len(data.users) == len(small_words.users)
    for u in (0, 7):
        rows = data.users[u]
        assert rows.shape == (len(small_words.users[u]), 31) and rows.max() < 60
        assert np.all(rows[:, 0] == data.vocab.bos_id)
    # the subword rows spell the same words (untruncated sentences)
    sp = data.tokenizer  # trained on the public sentences (bpe by default)
    assert isinstance(sp, SentencePieceTokenizer)
    again = SentencePieceTokenizer.train(rows_to_texts(small_words.public.sentences, small_words.vocab), 60, "bpe")
    assert again.model == sp.model  # deterministic: every Flower client process trains the same tokenizer
    words = rows_to_texts(small_words.test[:20], small_words.vocab)
    for row, word_of, text in zip(data.test[:20], data.test_word_of[:20], words):
        body = [t for t in row[1:] if t not in (0, data.vocab.eos_id)]
        kept = len(np.unique(word_of[word_of >= 0]))  # whole words that fit in sp_seq_len - 1 tokens
        assert kept >= 1 and sp.decode(body) == " ".join(text.split()[:kept])


def test_retokenized_users_encode_once_and_keep_a_bounded_cache(small_words, monkeypatch):
    data = apply_text_pipeline(small_words, {"tokenizer": "sentencepiece", "sp_vocab_size": 60, "sp_seq_len": 30})
    users = data.users
    users.cache_users = 2
    calls = []
    monkeypatch.setattr(text_pipeline, "encode_rows", lambda *a: calls.append(a) or encode_rows(*a))
    first = users[3]
    assert len(calls) == 1
    assert users[3] is first and len(calls) == 1  # sampled again: not re-encoded
    with pytest.raises(ValueError):
        first[0, 0] = 1  # shared, so read-only
    users[4], users[5]  # evicts user 3 (cache of 2)
    again = users[3]
    assert len(calls) == 4 and again is not first
    np.testing.assert_array_equal(again, first)


def test_sentencepiece_training_never_sees_private_text(small_words):
    """Changing private users and test sentences changes nothing in the tokenizer."""
    other = FederatedDataset(name="x", vocab=small_words.vocab, seq_len=small_words.seq_len,
                             users=[u[::-1] for u in small_words.users[::-1]], test=small_words.test[::-1],
                             public=small_words.public)
    cfg = {"tokenizer": "sentencepiece", "sp_vocab_size": 60}
    a, b = apply_text_pipeline(small_words, cfg), apply_text_pipeline(other, cfg)
    np.testing.assert_array_equal(a.public.sentences, b.public.sentences)
    empty_public = FederatedDataset(name="x", vocab=small_words.vocab, seq_len=small_words.seq_len,
                                    users=small_words.users, test=small_words.test, public=None)
    with pytest.raises(ConfigError, match="trains on the public corpus"):
        apply_text_pipeline(empty_public, cfg)


def test_word_accuracy_equals_token_accuracy_for_a_word_tokenizer(small_words):
    tok = WordTokenizer(small_words.vocab.words)
    rows, word_of = encode_rows(tok, rows_to_texts(small_words.test, small_words.vocab), small_words.seq_len)
    torch.manual_seed(0)
    model = build_model("lstm", small_words.vocab.size, embed_dim=8, hidden_size=16, projection_dim=8)
    out = evaluate(model, rows, small_words.vocab, word_of=word_of)
    assert out["word_accuracy"] == pytest.approx(out["accuracy"], abs=1e-12)


def test_sentencepiece_run_end_to_end_reports_next_word_accuracy(run_cli, tmp_path):
    proc = run_cli("+experiment=smoke", "data.tokenizer=sentencepiece", "data.sp_vocab_size=60", "rounds=2",
                   "eval_every=2", "progress=false", f"run_dir={tmp_path / 'r'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "final next-word accuracy" in proc.stdout and "next-token accuracy" in proc.stdout
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert 0 <= summary["final"]["word_accuracy"] <= 1


def test_bad_tokenizer_exit_2(run_cli, tmp_path):
    proc = run_cli("+experiment=smoke", "data.tokenizer=bytes", f"run_dir={tmp_path / 'r'}")
    assert proc.returncode == 2 and "data.tokenizer" in proc.stderr
    assert not (tmp_path / "r").exists()


# --- issue 52, item 6: whether the tokenizer fits the data, from the test split only -------------

def _replaced(data: FederatedDataset, users=None, test=None) -> FederatedDataset:
    return FederatedDataset(name="x", vocab=data.vocab, seq_len=data.seq_len,
                            users=data.users if users is None else users, test=data.test if test is None else test,
                            public=data.public)


def _unknown(rows: np.ndarray, vocab, share_of_rows: float = 1.0) -> np.ndarray:
    """``rows`` with every word of the first ``share_of_rows`` of them replaced by the OOV id."""
    out = rows.copy()
    head = out[:int(round(len(out) * share_of_rows))]
    head[(head >= 1) & (head <= len(vocab.words))] = vocab.oov_id
    return out


def _oov_share(rows: np.ndarray, vocab) -> float:
    words = rows[(rows != vocab.pad_id) & (rows != vocab.bos_id) & (rows != vocab.eos_id)]
    return float((words == vocab.oov_id).mean())


def test_unknown_share_is_measured_on_the_test_split_only(small_words):
    """test_unknown_share (summary.json) is the share of the test split's words the vocabulary does
    not know; training users whose every word is unknown change nothing (their text is never looked
    at), a test split whose every word is unknown is refused."""
    test = _unknown(small_words.test, small_words.vocab, 0.5)
    expected = _oov_share(test, small_words.vocab)
    assert 0.3 < expected < 0.7
    unknown_users = [_unknown(u, small_words.vocab) for u in small_words.users]
    for users in (None, unknown_users):
        data = apply_text_pipeline(_replaced(small_words, users=users, test=test), {})
        assert data.test_unknown_share == pytest.approx(expected, abs=1e-12)
    assert apply_text_pipeline(_replaced(small_words, users=unknown_users), {}).test_unknown_share == \
        pytest.approx(_oov_share(small_words.test, small_words.vocab), abs=1e-12)
    with pytest.raises(ConfigError, match="every word of the test split is unknown to the word vocabulary"):
        apply_text_pipeline(_replaced(small_words, test=_unknown(small_words.test, small_words.vocab)), {})


def test_a_high_unknown_share_is_warned_naming_the_test_split(small_words, caplog):
    with caplog.at_level("WARNING", logger="fedpriv.data.text_pipeline"):
        apply_text_pipeline(small_words, {})
        assert not caplog.records  # the synthetic vocabulary knows its words
        apply_text_pipeline(_replaced(small_words, test=_unknown(small_words.test, small_words.vocab, 0.5)), {})
    (record,) = caplog.records
    assert "of the test split's words are unknown to the word vocabulary" in record.getMessage()
    assert "a statistic of the test split" in record.getMessage() and "data.vocab_path" in record.getMessage()


def test_the_unknown_share_of_a_subword_tokenizer_counts_the_words_it_cannot_encode(small_words):
    test = _unknown(small_words.test, small_words.vocab, 0.5)
    data = apply_text_pipeline(_replaced(small_words, test=test), {"tokenizer": "sentencepiece", "sp_vocab_size": 60})
    # SentencePiece spells every other word with the public corpus' characters: the OOV words remain
    assert data.test_unknown_share == pytest.approx(_oov_share(test, small_words.vocab), abs=1e-12)
