"""``data=files`` (fedpriv/data/files.py): the refusal of a run with no public tokenization, the same
rows as the StackOverflow loader for the same text, users read lazily and checked on every read,
the public test split, and subword tokenizers on files. Every test builds its own small files."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest

from fedpriv import schema
from fedpriv.config.resolve import run_config
from fedpriv.data.files import NO_PUBLIC_TOKENIZATION, FilesUsers, write_tiny_files
from fedpriv.data.files_index import split_of
from fedpriv.data.stackoverflow import load_stackoverflow
from fedpriv.data.stackoverflow_writer import write_examples
from fedpriv.errors import ConfigError
from fedpriv.task import load_dataset
from fedpriv.text.tokenizers import encode_rows
from tests.conftest import compose_cfg

WORDS = ["how", "to", "sort", "a", "list", "in", "python", "i", "do", "it", "Why"]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A fresh cache and home per test (nothing is written under the user's HOME)."""
    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    yield
    assert not any((tmp_path / "home").iterdir())


def _data(**keys):
    return schema.load("data", {"name": "files", **keys})


def _tiny(tmp_path, **keys):
    rows, counts = write_tiny_files(tmp_path)
    return _data(**{"path": str(rows), "user_column": "user", "text_column": "text", "vocab_path": str(counts),
                    "vocab_size": 300, "seq_len": 8, **keys})


# --- the refusal ---------------------------------------------------------------------------------

def test_a_run_without_a_public_vocabulary_or_tokenizer_is_refused_before_anything_is_written(tmp_path, run_cli):
    rows, _ = write_tiny_files(tmp_path)
    run = tmp_path / "run"
    res = run_cli("+experiment=smoke", "data=files", f"data.path={rows}", "data.user_column=user",
                  "data.text_column=text", f"run_dir={run}")
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines() == [f"error: {NO_PUBLIC_TOKENIZATION}"] and "Traceback" not in res.stderr
    for option in ("data.vocab_path", "data.tokenizer=sentencepiece", "data.public_source", "data.tokenizer=hf",
                   "data.tokenizer_path", "python -m fedpriv.data word-counts PUBLIC_TEXT -o FILE"):
        assert option in res.stderr
    assert not run.exists() and not (tmp_path / "cache").exists()  # nothing written, not even the data cache


@pytest.mark.parametrize("overrides,refused", [
    ((), True),
    (("data.vocab_path=counts.txt",), False),
    (("data.tokenizer=sentencepiece",), True),  # no public corpus to train it on
    (("data.tokenizer=sentencepiece", "data.public_source=text", "data.public_path=public.txt"), False),
    (("data.tokenizer=hf",), True),
    (("data.tokenizer=hf", "data.tokenizer_path=tok"), False),
])
def test_the_refusal_is_checked_when_the_config_is_parsed(tmp_path, overrides, refused):
    cfg = compose_cfg("data=files", "data.path=rows.jsonl", "data.user_column=user", "data.text_column=text",
                      *overrides, run_dir=tmp_path / "r")
    if refused:
        with pytest.raises(ConfigError, match="needs a public vocabulary or tokenizer"):
            run_config(cfg)
    else:
        run_config(cfg)


def test_model_hf_gives_its_own_tokenizer(tmp_path):
    """data.tokenizer=hf with model=hf needs no data.tokenizer_path: the model's directory has it."""
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text("{}")
    spec = run_config(compose_cfg("data=files", "data.path=rows.jsonl", "data.user_column=user",
                                  "data.text_column=text", "data.tokenizer=hf", "model=hf", f"model.path={hf_dir}",
                                  run_dir=tmp_path / "r"))
    assert spec.data.tokenizer_path == str(hf_dir)


@pytest.mark.parametrize("key,value,says", [
    ("user_column", None, "data.user_column"), ("path", None, "data.path"),
    ("test_fraction", 0.0, "data.test_fraction"), ("test_fraction", 1.0, "data.test_fraction"),
    ("split_seed", -1, "data.split_seed"), ("max_sentences_per_user", 0, "data.max_sentences_per_user"),
    ("public_source", "embedded", "embedded"),
])
def test_bad_keys_are_one_line_config_errors(tmp_path, key, value, says):
    keys = {"path": "rows.jsonl", "user_column": "user", "text_column": "text", "vocab_path": "counts.txt"}
    cfg = compose_cfg("data=files", *(f"data.{k}={v}" for k, v in keys.items()), run_dir=tmp_path / "r")
    cfg["data"][key] = value
    with pytest.raises(ConfigError, match=says.replace(".", r"\.")) as err:
        run_config(cfg)
    assert "\n" not in str(err.value)


# --- the same rows as the StackOverflow loader -----------------------------------------------------

def _rows(seed: int = 3) -> list[tuple[str, str, str]]:
    """(split, user, tokens) rows in no order: train, test and heldout users, some users on both
    sides, sentences longer than seq_len, unknown words, one user above the per-user cap."""
    rng = random.Random(seed)
    rows = []
    for u in range(9):
        for split, n in (("train", rng.randint(1, 7)), ("test", rng.randint(0, 3)), ("heldout", rng.randint(0, 1))):
            rows += [(split, f"c{u}", " ".join(rng.choices(WORDS + ["zzz"], k=rng.randint(1, 9)))) for _ in range(n)]
    rows += [("train", "c3", "how to sort")] * 12  # above the cap of 10
    rng.shuffle(rows)
    return rows


def test_jsonl_with_a_split_column_gives_the_stackoverflow_loaders_users_test_rows_and_ids(tmp_path):
    rows = _rows()
    db = write_examples(tmp_path / "so.sqlite", rows)
    jsonl = tmp_path / "data" / "rows.jsonl"
    jsonl.parent.mkdir()
    jsonl.write_text("".join(json.dumps({"who": c, "body": t, "part": s}) + "\n" for s, c, t in rows))
    counts = tmp_path / "counts.txt"
    counts.write_text("".join(f"{w}\t{100 - i}\n" for i, w in enumerate(WORDS)))
    before = sorted((p.name, p.stat().st_mtime_ns) for p in jsonl.parent.iterdir())
    common = dict(vocab_size=8, seq_len=6, max_sentences_per_user=10, max_test_sentences=7, seed=5)
    so = load_stackoverflow(db, vocab_path=counts, **common)
    files = _data(path=str(jsonl), user_column="who", text_column="body", split_column="part", preprocess="none",
                  vocab_path=str(counts), **common).load_words()
    users = files.users
    assert isinstance(users, FilesUsers) and len(users) == len(so.users) == 9
    opened = users._handle()
    assert [opened.index.id_of(int(n)) for n in opened.numbers] == list(so.users.client_ids)
    for i in range(len(users)):
        np.testing.assert_array_equal(users[i], so.users[i])
    assert len(users[3]) == 10
    assert files.test.shape == so.test.shape == (7, 7)
    np.testing.assert_array_equal(files.test, so.test)
    assert files.vocab == so.vocab
    assert files.unigram_accuracy is not None and "word-count file" in files.reference_source
    assert sorted((p.name, p.stat().st_mtime_ns) for p in jsonl.parent.iterdir()) == before  # nothing written there


def test_a_split_column_without_test_rows_is_refused_in_one_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"u": f"a{i}", "t": "how to sort", "s": "train"}) + "\n" for i in range(4)))
    counts = tmp_path / "counts.txt"
    counts.write_text("how\t3\n")
    with pytest.raises(ConfigError, match="nothing to evaluate on") as err:
        _data(path=str(path), user_column="u", text_column="t", split_column="s", vocab_path=str(counts)).load_words()
    assert "\n" not in str(err.value) and "'test'" in str(err.value)


# --- users held out by the public rule; lazy users ---------------------------------------------------

def test_without_a_split_column_whole_users_are_held_out_by_the_public_rule(tmp_path):
    data = _tiny(tmp_path).load_words()
    opened = data.users._handle()
    train_ids = [opened.index.id_of(int(n)) for n in opened.numbers]
    test_ids = [opened.index.id_of(int(n)) for n in opened.test_users]
    assert len(train_ids) == len(data.users) == 12 and len(test_ids) == 4
    assert not split_of(train_ids, 0.1, 0).any() and split_of(test_ids, 0.1, 0).all()
    assert train_ids == sorted(train_ids)  # NaturalIdPartitioner's order
    records = [json.loads(line) for line in (tmp_path / "files_tiny" / "rows.jsonl").read_text().splitlines()]
    test_sentences = [s for r in records if r["user"] in test_ids for s in r["text"].split("\n")]
    words = data.vocab.words
    decoded = [" ".join(words[t - 1] for t in row[1:] if 1 <= t <= len(words)) for row in data.test]
    assert sorted(decoded) == sorted(test_sentences)  # every test user's sentences, and nothing else
    assert "held-out test users" in data.reference_source
    assert _tiny(tmp_path, max_users=5).load_words().users.count == 5


def test_txt_files_are_one_user_each_and_every_line_a_row(tmp_path):
    """``.txt`` input: a user per file (its path under data.path), a row per non-empty line."""
    data = tmp_path / "users"
    names = [f"{'group/' if i % 3 == 0 else ''}user{i:02d}.txt" for i in range(16)]
    for i, name in enumerate(names):
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_text("".join(f"How to sort {'a list' if j % 2 else 'it'}?\n\n" for j in range(i % 4 + 1)))
    counts = tmp_path / "counts.txt"
    counts.write_text("how\t9\nto\t8\nsort\t7\n?\t6\na\t5\nlist\t4\n")
    data = _data(path=str(data), user_column="file", text_column="text", vocab_path=str(counts),
                 seq_len=6).load_words()
    is_test = split_of(sorted(names), 0.1, 0)
    train = [n for n, t in zip(sorted(names), is_test) if not t]
    assert len(data.users) == len(train) and is_test.any()
    bos, eos, oov = data.vocab.bos_id, data.vocab.eos_id, data.vocab.oov_id
    for i, name in enumerate(train):
        lines = names.index(name) % 4 + 1
        want = [[bos, 1, 2, 3, oov, 4, eos] if j % 2 == 0 else [bos, 1, 2, 3, 5, 6, 4] for j in range(lines)]
        np.testing.assert_array_equal(data.users[i], want)  # seq_len 6: "how to sort a list ?" loses its EOS
    assert len(data.test) == sum(names.index(n) % 4 + 1 for n, t in zip(sorted(names), is_test) if t)


def test_tff_preprocessing_splits_and_normalises_sentences(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"u": u, "t": t}) + "\n" for u, t in [
        ("user04", "How to sort?  Then IT\nworks"), ("user00", "How to"), ("user01", "to")]))
    counts = tmp_path / "counts.txt"
    counts.write_text("how\t9\nto\t8\nsort\t7\n?\t6\n")
    data = _data(path=str(path), user_column="u", text_column="t", vocab_path=str(counts), seq_len=4).load_words()
    assert split_of(["user04"], 0.1, 0).all()  # the test user
    bos, eos, oov = data.vocab.bos_id, data.vocab.eos_id, data.vocab.oov_id
    np.testing.assert_array_equal(data.test, [[bos, 1, 2, 3, 4], [bos, oov, oov, eos, 0], [bos, oov, eos, 0, 0]])
    np.testing.assert_array_equal(data.users[0], [[bos, 1, 2, eos, 0]])


def test_the_pickle_is_small_and_a_clone_reads_the_same_users(tmp_path):
    users = _tiny(tmp_path).load_words().users
    size = len(pickle.dumps(users))
    rows = [users[i] for i in range(len(users))]
    assert len(pickle.dumps(users)) == size < 64_000  # reading users adds nothing to it
    clone = pickle.loads(pickle.dumps(users))
    assert clone._opened is None
    for i, r in enumerate(rows):
        np.testing.assert_array_equal(clone[i], r)
    assert len(users._cache) <= users.cache_size


def _poison(tmp_path, one: int, other: int) -> None:
    """Swap one row position of user number ``one`` with one of ``other`` in the cached index: still
    well-formed (every position once, offsets unchanged), so only the reads' own checks can see it."""
    (index_dir,) = (tmp_path / "cache" / "files").glob("*/index-*")
    offsets = np.load(index_dir / "offsets.npy")
    order = np.load(index_dir / "order.npy")
    a, b = offsets[one], offsets[other]
    order[a], order[b] = order[b], order[a]
    np.save(index_dir / "order.npy", order)


def test_every_read_checks_the_rows_hold_the_users_id_and_side(tmp_path):
    spec = _tiny(tmp_path)
    data = spec.load_words()
    opened = data.users._handle()
    first, second = (int(n) for n in opened.numbers[:2])
    test_user = int(opened.test_users[0])
    expected = data.users[2]
    _poison(tmp_path, first, second)  # two train users swap a row
    poisoned = spec.load_words().users
    with pytest.raises(ConfigError, match="does not match its rows.*another user id") as err:
        poisoned[0]
    assert "\n" not in str(err.value)
    np.testing.assert_array_equal(poisoned[2], expected)  # the others read as before
    _poison(tmp_path, first, second)  # undone
    _poison(tmp_path, first, test_user)  # a train user and a test user swap a row
    with pytest.raises(ConfigError, match="belongs to a train user"):
        spec.load_words()


def test_a_worker_refuses_data_that_changed_since_the_load(tmp_path):
    spec = _tiny(tmp_path)
    users = spec.load_words().users
    clone = pickle.loads(pickle.dumps(users))
    with open(spec.path, "a") as f:
        f.write(json.dumps({"user": "user99", "text": "w1 w2"}) + "\n")
    with pytest.raises(ConfigError, match="changed since this run loaded it"):
        clone[0]


# --- subword tokenizers on files -------------------------------------------------------------------

def _public_text(tmp_path) -> Path:
    rng = random.Random(1)
    words = [f"w{i}" for i in range(1, 301)]
    path = tmp_path / "public.txt"
    path.write_text("".join(" ".join(rng.choices(words, [1 / i for i in range(1, 301)], k=8)) + "\n"
                            for _ in range(300)))
    return path


def test_sentencepiece_trained_on_public_text_encodes_every_split_once(tmp_path):
    public = _public_text(tmp_path)
    spec = _tiny(tmp_path, tokenizer="sentencepiece", public_source="text", public_path=str(public),
                 sp_vocab_size=60, sp_seq_len=12, vocab_path=None)
    data = load_dataset(schema.as_dict(spec))
    tok = data.tokenizer
    assert data.info["tokenizer"] == "sentencepiece" and data.vocab.size == tok.size == 60 and data.seq_len == 12
    assert data.vocab.words is None and data.test_word_of is not None and data.unigram_accuracy is None
    assert data.public is not None and data.public.sentences.max() < 60 and data.test_unknown_share is not None
    # trained on the public text only: other private text gives the same tokenizer
    again = _tiny(tmp_path / "other", tokenizer="sentencepiece", public_source="text", public_path=str(public),
                  sp_vocab_size=60, sp_seq_len=12, vocab_path=None)
    other = [{"user": "user04", "text": "w299 w298"}, {"user": "user00", "text": "w3"}]
    (tmp_path / "other" / "files_tiny" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in other))
    assert load_dataset(schema.as_dict(again)).tokenizer.model == tok.model
    first = data.users[0]
    assert first.shape[1] == 13 and first.max() < 60
    np.testing.assert_array_equal(first[:, 0], tok.bos_id)


def test_an_hf_tokenizer_encodes_the_users_text(tmp_path):
    from fedpriv.schema import options
    from fedpriv.text.hf_tokenizer import HFTokenizer

    (model_path,) = [o.split("=", 1)[1] for o in options("model")["hf"].example_overrides(tmp_path)
                     if o.startswith("model.path=")]
    spec = _tiny(tmp_path, tokenizer="hf", tokenizer_path=model_path, vocab_path=None)
    data = load_dataset(schema.as_dict(spec))
    tok = HFTokenizer.load(model_path)
    assert isinstance(data.tokenizer, HFTokenizer) and data.vocab.size == tok.size and data.seq_len == 16
    opened = data.users._handle()
    user = opened.index.id_of(int(opened.numbers[0]))
    texts = [s for r in map(json.loads, Path(spec.path).read_text().splitlines()) if r["user"] == user
             for s in r["text"].split("\n")]
    np.testing.assert_array_equal(data.users[0], encode_rows(tok, texts, 16)[0])
    assert data.test_unknown_share == 0.0
