"""StackOverflow loader: Example codec, TFF preprocessing, lazy users, errors (no TensorFlow)."""

from __future__ import annotations

import logging
import pickle
import sqlite3
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from fedpriv.data.stackoverflow import (
    SqliteUsers,
    decode_example,
    load_stackoverflow,
    load_word_counts,
)
from fedpriv.errors import ConfigError
from fedpriv.data.stackoverflow_writer import encode_example, write_examples

# Word-count file: with vocab_size=5 the ids are i=1 how=2 to=3 a=4 list=5, OOV 6, BOS 7, EOS 8.
WORD_COUNTS = "i\t90\nhow\t80\nto\t70\na\t60\nlist\t50\nsort\t40\ndo\t30\n"
BOS, EOS, OOV = 7, 8, 6

# (split, client, tokens) in file order; train clients are deliberately out of sorted order.
ROWS = [
    ("train", "c2", "how to"),
    ("train", "c10", "how do i sort a list"),  # 6 words = seq_len: EOS is lost
    ("train", "c2", "a list to i how"),
    ("heldout", "h0", "how to"),
    ("train", "c1", "i i i i i i i i"),  # longer than seq_len
    ("train", "c2", "list"),
    ("train", "c10", "to a"),
    ("train", "c2", "i"),
    ("train", "c2", "how"),  # c2's 5th sentence: beyond a cap of 4
    ("test", "t9", ""),  # empty sentence
]
# 30 distinct two-word test sentences (the second word may be OOV), spread over 3 clients.
WORDS = ["i", "how", "to", "a", "list", "zzz"]
ROWS += [("test", f"t{k % 3}", f"{WORDS[k % 5]} {WORDS[k // 5]}") for k in range(30)]


def make_db(path: Path, rows=ROWS, *, metadata: bool = False, index: bool = False) -> Path:
    """A sqlite file with TFF's schema; each example carries TFF's features, not only ``tokens``."""
    return write_examples(path, rows, metadata=metadata, index=index)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    (tmp_path / "stackoverflow.word_count").write_text(WORD_COUNTS)
    return make_db(tmp_path / "stackoverflow.sqlite")


def load(path: Path, **kwargs):
    kwargs = {"vocab_size": 5, "seq_len": 6, **kwargs}
    return load_stackoverflow(path, **kwargs)


# --- tf.train.Example codec -------------------------------------------------------------------


@pytest.mark.parametrize("packed", [True, False])
def test_example_round_trip(packed: bool) -> None:
    features = {
        "tokens": [b"how to sort a list", b""],
        "score": [0, 1, 300, -1, -(2**63), 2**63 - 1],
        "weights": [0.5, -2.25, 1e10],
        "empty": [],
    }
    decoded = decode_example(encode_example(features, packed=packed))
    assert decoded["tokens"] == features["tokens"]
    assert decoded["score"] == features["score"]
    assert decoded["weights"] == pytest.approx(features["weights"])
    assert decoded["empty"] == []


def test_packed_and_unpacked_encodings_differ_but_decode_alike() -> None:
    packed = encode_example({"n": [1, 2, -3]}, packed=True)
    unpacked = encode_example({"n": [1, 2, -3]}, packed=False)
    assert packed != unpacked
    assert decode_example(packed) == decode_example(unpacked) == {"n": [1, 2, -3]}


def test_example_golden_bytes_and_unknown_fields() -> None:
    # Example{features{feature{key: "a" value{int64_list{value: [1]}}}}}, hand-encoded.
    golden = bytes.fromhex("0a0c" "0a0a" "0a0161" "1205" "1a03" "0a0101")
    assert encode_example({"a": [1]}) == golden
    assert decode_example(golden + bytes.fromhex("1007")) == {"a": [1]}  # unknown field 2 skipped


def test_example_matches_protobuf_library() -> None:
    """Cross-check against google.protobuf with Example's schema built at runtime (no TensorFlow)."""
    descriptor_pb2 = pytest.importorskip("google.protobuf.descriptor_pb2")
    from google.protobuf import descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="fp_example.proto", package="fptest", syntax="proto3")
    lists = (("BytesList", F.TYPE_BYTES), ("FloatList", F.TYPE_FLOAT), ("Int64List", F.TYPE_INT64))
    for name, ftype in lists:
        message = fdp.message_type.add(name=name)
        message.field.add(name="value", number=1, type=ftype, label=F.LABEL_REPEATED)
    feature = fdp.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, type_name) in enumerate(
        (("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")), start=1
    ):
        feature.field.add(
            name=name, number=number, type=F.TYPE_MESSAGE, type_name=f".fptest.{type_name}", oneof_index=0
        )
    features = fdp.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, type_name=".fptest.Feature")
    features.field.add(
        name="feature", number=1, type=F.TYPE_MESSAGE, type_name=".fptest.Features.FeatureEntry",
        label=F.LABEL_REPEATED,
    )
    fdp.message_type.add(name="Example").field.add(
        name="features", number=1, type=F.TYPE_MESSAGE, type_name=".fptest.Features"
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    example_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("fptest.Example"))

    message = example_cls()
    message.features.feature["tokens"].bytes_list.value.extend([b"how to", b"x"])
    message.features.feature["score"].int64_list.value.extend([5, -7, 2**40])
    message.features.feature["w"].float_list.value.extend([0.25, -1.5])
    expected = {"tokens": [b"how to", b"x"], "score": [5, -7, 2**40], "w": [0.25, -1.5]}
    assert decode_example(message.SerializeToString()) == expected
    assert example_cls.FromString(encode_example(expected)) == message
    assert example_cls.FromString(encode_example(expected, packed=False)) == message


# --- preprocessing ----------------------------------------------------------------------------


def test_vocabulary_layout(db: Path) -> None:
    data = load(db)
    v = data.vocab
    assert (v.size, v.pad_id, v.oov_id, v.bos_id, v.eos_id) == (9, 0, OOV, BOS, EOS)
    assert v.words == ("i", "how", "to", "a", "list")
    assert data.name == "stackoverflow" and data.seq_len == 6
    assert data.ceiling_accuracy is None and data.unigram_accuracy is None
    assert data.info["vocab_size"] == 5 and data.info["num_users"] == 3 and data.info["num_test"] == 31


def test_exact_ids(db: Path) -> None:
    users = load(db).users  # sorted ids: c1, c10, c2
    np.testing.assert_array_equal(users[0], [[BOS, 1, 1, 1, 1, 1, 1]])  # truncated, EOS lost
    np.testing.assert_array_equal(
        users[1],
        [
            [BOS, 2, OOV, 1, OOV, 4, 5],  # exactly seq_len words: EOS lost
            [BOS, 3, 4, EOS, 0, 0, 0],
        ],
    )
    np.testing.assert_array_equal(users[2][:2], [[BOS, 2, 3, EOS, 0, 0, 0], [BOS, 4, 5, 3, 1, 2, EOS]])
    assert users[2].dtype == np.int64 and users[2].shape == (5, 7)


def test_per_user_cap_keeps_first_sentences_in_file_order(db: Path) -> None:
    capped = load(db, max_sentences_per_user=4).users[2]
    full = load(db).users[2]
    assert len(capped) == 4
    np.testing.assert_array_equal(capped, full[:4])
    np.testing.assert_array_equal(full[4], [BOS, 2, EOS, 0, 0, 0, 0])  # the dropped "how"


def test_users_sorted_by_client_id_and_max_users(db: Path) -> None:
    users = load(db).users
    assert users.client_ids == ("c1", "c10", "c2")  # heldout/test clients excluded
    assert load(db, max_users=2).users.client_ids == ("c1", "c10")


def test_client_metadata_gives_same_users(tmp_path: Path) -> None:
    (tmp_path / "stackoverflow.word_count").write_text(WORD_COUNTS)
    path = make_db(tmp_path / "stackoverflow.sqlite", metadata=True)
    users = load(path).users
    assert users.client_ids == ("c1", "c10", "c2")
    assert len(users[2]) == 5


def test_lazy_users_sequence_and_pickle(db: Path) -> None:
    users = load(db).users
    assert isinstance(users, SqliteUsers) and isinstance(users, Sequence)
    assert users._opened is None  # nothing read until indexed
    assert len(users) == 3
    np.testing.assert_array_equal(users[-1], users[2])
    np.testing.assert_array_equal(users[np.int64(1)], users[1])
    with pytest.raises(IndexError):
        users[3]
    users[0][0, 0] = -1  # callers get copies: the cache is unharmed
    assert users[0][0, 0] == BOS
    clone = pickle.loads(pickle.dumps(users))
    assert clone._opened is None
    for u in range(len(users)):
        np.testing.assert_array_equal(clone[u], users[u])
    assert [len(u) for u in users] == [1, 2, 5]


def test_file_is_not_modified(db: Path) -> None:
    before = db.read_bytes()
    users = load(db).users
    _ = [users[u] for u in range(len(users))]
    assert db.read_bytes() == before


def test_index_note(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The advice to make an indexed copy is given (as advice: stderr) by the load that makes the
    pass over the table; a load that finds the map cached, or an indexed file, says nothing."""
    from fedpriv.release.console import ADVICE_LOGGER

    (tmp_path / "stackoverflow.word_count").write_text(WORD_COUNTS)
    plain = make_db(tmp_path / "stackoverflow.sqlite")
    with caplog.at_level(logging.INFO, logger="fedpriv"):
        assert load(plain).info["client_index"] is False
    notes = [r for r in caplog.records if "no index" in r.getMessage()]
    assert len(notes) == 1 and notes[0].name == ADVICE_LOGGER and "prepare_stackoverflow" in notes[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fedpriv"):
        assert load(plain).info["client_index"] is False  # the map is cached: no pass, no advice
    assert "no index" not in caplog.text
    indexed = make_db(tmp_path / "indexed.sqlite", index=True)
    with caplog.at_level(logging.INFO, logger="fedpriv"):
        data = load(indexed, vocab_path=tmp_path / "stackoverflow.word_count")
    assert data.info["client_index"] is True and "no index" not in caplog.text


# --- test split -------------------------------------------------------------------------------


def test_test_subset_is_deterministic(db: Path) -> None:
    full = load(db).test
    assert full.shape == (31, 7) and full.dtype == np.int64
    np.testing.assert_array_equal(full[0], [BOS, EOS, 0, 0, 0, 0, 0])  # the empty sentence
    np.testing.assert_array_equal(full[-1], [BOS, 5, OOV, EOS, 0, 0, 0])  # "list zzz"
    a = load(db, max_test_sentences=10, seed=3).test
    b = load(db, max_test_sentences=10, seed=3).test
    c = load(db, max_test_sentences=10, seed=4).test
    assert a.shape == (10, 7)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    full_rows = [tuple(r) for r in full]
    positions = [full_rows.index(tuple(r)) for r in a]  # test rows are all distinct
    assert positions == sorted(positions)  # a subset, in file order
    with pytest.raises(ConfigError, match="data.max_test_sentences must be >= 1, got 0"):  # as the option says
        load(db, max_test_sentences=0)


# --- vocabulary and errors --------------------------------------------------------------------


def test_load_word_counts(tmp_path: Path) -> None:
    path = tmp_path / "wc"
    path.write_text(WORD_COUNTS + "\n")
    assert load_word_counts(path) == ["i", "how", "to", "a", "list", "sort", "do"]


@pytest.mark.parametrize("content, needle", [
    (bytes(range(1, 128)) * 8, "is not 'word<TAB>count'"),  # binary junk that is valid UTF-8 (accepted before)
    (bytes(range(128, 256)) * 8, "not UTF-8 text"),  # binary junk that is not (a traceback before)
    (b"how\t3\nto\ttwo\n", "line 2 is not 'word<TAB>count'"),
    (b"how\t3\nhow\t2\n", "line 2 repeats the word 'how'"),
    (b"\n\n", "lists no word"),
])
def test_a_word_count_file_that_does_not_parse_is_refused(tmp_path: Path, content: bytes, needle: str) -> None:
    """A damaged or foreign vocabulary file never becomes a vocabulary (issue 52, item 6)."""
    path = tmp_path / "stackoverflow.word_count"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=needle) as err:
        load_word_counts(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_a_train_example_that_does_not_decode_is_one_line_naming_the_file(db: Path) -> None:
    """Read lazily, mid-run: an example that is not a tf.train.Example names the file (issue 52, item 7)."""
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE examples SET serialized_example_proto = ? WHERE client_id = 'c2'", (b"\xff" * 9,))
    data = load(db)
    users = list(data.users.client_ids)
    with pytest.raises(ConfigError, match="not a serialized tf.train.Example") as err:
        data.users[users.index("c2")]
    assert str(db) in str(err.value)
    assert len(data.users[users.index("c1")])  # the other users read as before


def test_missing_sqlite_is_one_line_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "stackoverflow.sqlite"
    with pytest.raises(ConfigError) as err:
        load_stackoverflow(missing)
    message = str(err.value)
    assert "\n" not in message
    assert str(missing) in message and "stackoverflow.sqlite.lzma" in message and "data.path=" in message


def test_missing_vocab_is_one_line_config_error(tmp_path: Path) -> None:
    path = make_db(tmp_path / "stackoverflow.sqlite")
    with pytest.raises(ConfigError) as err:
        load(path)
    assert "\n" not in str(err.value) and "stackoverflow.word_count" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load(path, vocab_path=tmp_path / "missing.word_count")
    assert "\n" not in str(err.value) and "missing.word_count" in str(err.value)


def test_not_a_database_is_config_error(tmp_path: Path) -> None:
    path = tmp_path / "stackoverflow.sqlite"
    path.write_bytes(b"not sqlite" * 200)
    with pytest.raises(ConfigError):
        load(path, vocab_path=path)


@pytest.mark.parametrize("arg", ["vocab_size", "seq_len", "max_sentences_per_user", "max_users"])
def test_bad_arguments_are_config_errors(db: Path, arg: str) -> None:
    with pytest.raises(ConfigError, match=arg):
        load(db, **{arg: 0})


def test_private_vocab_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = make_db(tmp_path / "stackoverflow.sqlite")
    with pytest.warns(UserWarning, match="outside the differential-privacy guarantee"):
        with caplog.at_level(logging.WARNING, logger="fedpriv.data.stackoverflow"):
            data = load(path, allow_private_vocab=True, vocab_size=3, max_sentences_per_user=4)
    assert "private training data" in caplog.text
    # Train occurrences under the cap: i 11, how 3, to 3, a 3, list 3, do 1, sort 1 (ties by word).
    assert data.vocab.words == ("i", "a", "how")
    assert data.info["vocab_source"] == "private train split"
    assert "private train split" in data.info["non_private_reason"]  # the run then reports epsilon = inf
    np.testing.assert_array_equal(data.users[1][1], [5, 4, 2, 6, 0, 0, 0])  # "to a": to=OOV=4, a=2


def test_word_count_file_beats_private_vocab(db: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = load(db, allow_private_vocab=True)
    assert data.vocab.words == ("i", "how", "to", "a", "list")
    assert "non_private_reason" not in data.info
