"""The per-user index of a ``data=files`` table and the public test-split rule
(fedpriv/data/files_index.py)."""

from __future__ import annotations

import gc
import hashlib
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedpriv.data import files_index as fi
from fedpriv.data import files_source as fs
from fedpriv.errors import ConfigError
from fedpriv.text.corpora import datasets_module


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A fresh cache, and passes over the columns in slices of 64 rows (several slices per test)."""
    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var in ("HF_HOME", "HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):  # restored after the test
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    monkeypatch.setattr(fs, "STEP", 64)


def shuffled_rows(n_users: int = 120, n_rows: int = 900, seed: int = 3, ints: bool = False) -> list[dict]:
    """Rows in no order: users of very different sizes; string ids in mixed case and non-ASCII
    (code-point order differs from a case-folded or locale order), or integer ids (numeric order
    differs from their decimal strings' order)."""
    rng = np.random.default_rng(seed)
    if ints:
        ids = [int(v) for v in rng.choice(np.arange(-50, 10_000), n_users, replace=False)]
    else:
        ids = [f"user{k}" for k in range(n_users - 4)] + ["Zoë", "zoe", "Émile", "007"]
    owner = rng.choice(n_users, n_rows, p=rng.dirichlet(np.ones(n_users) * 0.5))
    split = rng.choice(["train", "train", "train", "test", "dev"], n_rows)
    return [{"user": ids[u], "text": f"sentence {i}", "split": str(s)} for i, (u, s) in enumerate(zip(owner, split))]


def write_jsonl(path, rows) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def reference(rows, only_train: bool = False) -> dict:
    """The index by the obvious dict of lists."""
    out: dict = {}
    for i, r in enumerate(rows):
        if r["split"] == "train" or not only_train:
            out.setdefault(r["user"], []).append(i)
    return out


def as_dict(index: fi.UserIndex) -> dict:
    return {index.id_of(u): index.rows_of(u).tolist() for u in range(len(index))}


@pytest.mark.parametrize("ints", [False, True])
def test_the_index_equals_a_dict_of_lists_on_shuffled_rows(tmp_path, ints):
    rows = shuffled_rows(ints=ints)
    if ints:
        path = tmp_path / "rows.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    source = fs.open_source(str(path) if ints else write_jsonl(tmp_path / "rows.jsonl", rows), "user", "text")
    index = fi.user_index(source)
    ref = reference(rows)
    assert [index.id_of(u) for u in range(len(index))] == sorted(ref)  # code-point / numeric order
    assert as_dict(index) == ref  # every row once, file order within a user
    assert index.test_rows is None and index.built_seconds is not None
    assert pa.types.is_int64(index.ids.type) if ints else pa.types.is_large_string(index.ids.type)
    some = sorted(ref)[len(ref) // 2]
    assert index.number_of(some) == sorted(ref).index(some)
    assert index.number_of("no such user" if not ints else 10**9) is None


def test_under_a_split_column_only_train_rows_are_indexed(tmp_path):
    rows = shuffled_rows()
    rows[7] = {"user": None, "text": "an ignored row needs no user id", "split": "dev"}
    source = fs.open_source(write_jsonl(tmp_path / "rows.jsonl", rows), "user", "text", "split")
    index = fi.user_index(source)
    assert as_dict(index) == reference(rows, only_train=True)
    assert index.test_rows.tolist() == [i for i, r in enumerate(rows) if r["split"] == "test"]


def test_a_datasetdict_indexes_its_train_split(tmp_path):
    rows = shuffled_rows()
    datasets = datasets_module()
    parts = {name: datasets.Dataset.from_list([r for r in rows if r["split"] == name]) for name in ("train", "test")}
    datasets.DatasetDict(parts).save_to_disk(str(tmp_path / "saved"))
    source = fs.open_source(str(tmp_path / "saved"), "user", "text")
    index = fi.user_index(source)
    assert as_dict(index) == reference([r for r in rows if r["split"] == "train"])
    assert index.test_rows is None and len(source.test) == sum(r["split"] == "test" for r in rows)


def test_a_cache_hit_does_not_rebuild_also_for_a_copy_elsewhere(tmp_path, monkeypatch):
    rows = shuffled_rows()
    first = fi.user_index(fs.open_source(write_jsonl(tmp_path / "a" / "rows.jsonl", rows), "user", "text"))
    monkeypatch.setattr(fi, "build", lambda *a, **k: pytest.fail("rebuilt"))
    monkeypatch.setattr(fs, "_convert_into", lambda *a, **k: pytest.fail("converted again"))
    for path in (tmp_path / "a" / "rows.jsonl", tmp_path / "b" / "copy.jsonl"):
        path.parent.mkdir(exist_ok=True)
        if not path.exists():
            shutil.copy(tmp_path / "a" / "rows.jsonl", path)
        again = fi.user_index(fs.open_source(str(path), "user", "text"))
        assert again.built_seconds is None and again.path == first.path and as_dict(again) == reference(rows)


def test_changed_content_or_columns_index_anew(tmp_path):
    rows = shuffled_rows()
    path = tmp_path / "rows.jsonl"
    first = fi.user_index(fs.open_source(write_jsonl(path, rows), "user", "text"))
    by_split = fi.user_index(fs.open_source(str(path), "user", "text", "split"))
    assert by_split.path != first.path and by_split.built_seconds is not None
    rows[5] = {**rows[5], "user": rows[6]["user"]}  # a row moves to another user
    changed = fi.user_index(fs.open_source(write_jsonl(path, rows), "user", "text"))
    assert changed.built_seconds is not None and as_dict(changed) == reference(rows)


def _corrupt(directory, how: str) -> None:
    def edit(name, change):
        a = np.load(directory / name)
        change(a)
        np.save(directory / name, a)

    if how == "row twice":
        edit("order.npy", lambda a: a.__setitem__(1, a[0]))
    elif how == "row out of range":
        edit("order.npy", lambda a: a.__setitem__(0, 10**6))
    elif how == "offsets not increasing":
        edit("offsets.npy", lambda a: a.__setitem__(1, 0))
    elif how == "ids not sorted":
        edit("id_data.npy", lambda a: a.__setitem__(slice(None), a[::-1].copy()))
    elif how == "truncated":
        data = (directory / "order.npy").read_bytes()
        (directory / "order.npy").write_bytes(data[: len(data) // 2])
    elif how == "a file missing":
        (directory / "offsets.npy").unlink()
    elif how == "another key":
        meta = json.loads((directory / "meta.json").read_text())
        (directory / "meta.json").write_text(json.dumps({**meta, "key": "0" * 64}))
    elif how == "meta not JSON":
        (directory / "meta.json").write_text("{")
    elif how == "test row also trained":
        edit("test_rows.npy", lambda a: a.__setitem__(0, int(np.load(directory / "order.npy")[0])))


@pytest.mark.parametrize("how", ["row twice", "row out of range", "offsets not increasing", "ids not sorted",
                                 "truncated", "a file missing", "another key", "meta not JSON",
                                 "test row also trained"])
def test_a_corrupt_entry_is_rebuilt(tmp_path, how):
    rows = shuffled_rows()
    source = fs.open_source(write_jsonl(tmp_path / "rows.jsonl", rows), "user", "text", "split")
    directory = fi.user_index(source).path
    gc.collect()  # no memory map of the entry left open while it is edited
    _corrupt(directory, how)
    assert fi.load(directory, source.columns_key, source.train.data.num_rows, "split") is None
    rebuilt = fi.user_index(source)
    assert rebuilt.built_seconds is not None
    assert as_dict(rebuilt) == reference(rows, only_train=True)
    assert not [p for p in source.entry.iterdir() if p.name.endswith((".tmp", ".old"))]


def test_the_index_is_owner_only(tmp_path):
    source = fs.open_source(write_jsonl(tmp_path / "rows.jsonl", shuffled_rows()), "user", "text", "split")
    directory = fi.user_index(source).path
    assert directory.parent == source.entry
    assert directory.stat().st_mode & 0o777 == 0o700 and source.entry.stat().st_mode & 0o777 == 0o700
    assert {p.name for p in directory.iterdir()} == {"meta.json", "offsets.npy", "order.npy", "id_offsets.npy",
                                                     "id_data.npy", "test_rows.npy"}
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in directory.iterdir())


# ---- the public test split -----------------------------------------------------------------

# BLAKE2b(id, key=b"fedpriv/data=files/test-split/v1", salt=seed as 16 bytes LE, 8-byte digest) as LE integers
GOLDEN = {
    0: {"alice": 0x40167F6AC29A4670, "007": 0x933BB44A47B8CB34, "123": 0x34A4902A7E649D8F, "Émile": 0xAC4ED581F6825CBF},
    1: {"alice": 0xAA03DC1520BD4000, "007": 0xF3CD2E90C4884CF5, "123": 0x599538C056F021F5, "Émile": 0x8F48FD1C2E053B2E},
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_the_split_rule_matches_its_golden_values(seed, fraction):
    ids = list(GOLDEN[seed])
    for user_id, word in GOLDEN[seed].items():  # the stated rule, computed here from hashlib alone
        digest = hashlib.blake2b(user_id.encode(), key=b"fedpriv/data=files/test-split/v1",
                                 salt=seed.to_bytes(16, "little"), digest_size=8).digest()
        assert int.from_bytes(digest, "little") == word
    expected = [GOLDEN[seed][u] < fraction * 2**64 for u in ids]
    assert fi.split_of(ids, fraction, seed).tolist() == expected


def test_integer_and_string_ids_split_alike():
    assert fi.split_of([123, 7, -4], 0.5, 0).tolist() == fi.split_of(["123", "7", "-4"], 0.5, 0).tolist()
    assert fi.split_of(pa.array([123, 7]), 0.5, 0).tolist() == fi.split_of(np.array([123, 7]), 0.5, 0).tolist()


def test_the_split_is_nested_in_the_fraction_and_stable_when_users_are_added():
    ids = [f"u{k}" for k in range(20_000)]
    low, high = fi.split_of(ids, 0.05, 0), fi.split_of(ids, 0.2, 0)
    assert not (low & ~high).any()  # raising the fraction only moves users into the test set
    assert abs(low.mean() - 0.05) < 0.01 and abs(high.mean() - 0.2) < 0.01
    more = fi.split_of(ids + [f"new{k}" for k in range(5_000)], 0.2, 0)
    assert (more[:len(ids)] == high).all()  # adding users moves no other user
    assert (fi.split_of(ids, 0.2, 1) != high).any()  # another split_seed, another split


@pytest.mark.parametrize("fraction,seed", [(-0.1, 0), (1.5, 0), (0.1, -1), (0.1, 2**128), (True, 0), (0.1, 1.0)])
def test_split_parameters_out_of_range_are_refused(fraction, seed):
    with pytest.raises(ConfigError):
        fi.split_of(["a"], fraction, seed)


def test_user_numbers_are_natural_id_partitioner_partition_ids(tmp_path):
    """Flower Datasets' convention: partition id = rank of the sorted natural id (a test where
    flwr-datasets is installed; it pins datasets<5, so it is not a dependency)."""
    partitioner = pytest.importorskip("flwr_datasets.partitioner")
    rows = shuffled_rows(n_users=30, n_rows=200)
    index = fi.user_index(fs.open_source(write_jsonl(tmp_path / "rows.jsonl", rows), "user", "text"))
    p = partitioner.NaturalIdPartitioner(partition_by="user")
    p.dataset = datasets_module().Dataset.from_list(rows)  # in memory: select() writes no cache file
    assert p.num_partitions == len(index)
    for u in range(len(index)):
        assert p.partition_id_to_natural_id[u] == index.id_of(u)
        assert p.load_partition(u)["text"] == [rows[i]["text"] for i in index.rows_of(u)]
