"""``python -m fedpriv.data`` (fedpriv/data/__main__.py, fedpriv/data/files_inspect.py): ``inspect``
says first that it is the owner's own view and not a release, gives numbers equal to a direct count
of a small generated file (and to what a run loads), writes no run directory and nothing into the
data directory, has a ``--json`` form; ``word-counts`` writes TFF's format that ``read_word_counts``
reads back, with the words a run's ``preprocess=tff`` makes, and never replaces a file unless
``--force``; every bad input is one ``error:`` line, exit 2, nothing written. Most calls are
in-process (``main(argv)``); two run the real command."""

from __future__ import annotations

import gzip
import json
import os
import random
import shlex
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fedpriv.config.compose import check_overrides
from fedpriv.config.resolve import run_config
from fedpriv.data import files_inspect
from fedpriv.data.__main__ import main
from fedpriv.data.files import NO_PUBLIC_TOKENIZATION
from fedpriv.data.files_index import split_of
from fedpriv.task import load_dataset
from fedpriv.text.vocabulary import read_word_counts
from tests.conftest import compose_cfg
from tests.helpers import call_main
from tests.warm_launcher import run_module

ROOT = Path(__file__).resolve().parent.parent
KNOWN = ["alpha", "beta", "gamma", "delta"]  # in the word-count file (with ".")
UNKNOWN = ["zeta", "eta"]  # not in it: the unknown token
CAP = 4  # data.max_sentences_per_user in these tests
FRACTION = 0.3  # data.test_fraction


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A fresh cache and home, and an empty working directory (where a run directory would appear)."""
    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    yield
    assert not any((tmp_path / "home").iterdir())
    assert not any((tmp_path / "cwd").iterdir())  # no run directory, no output of any kind
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith((".tmp", ".old"))]  # nothing half-written


def _users(seed: int = 5, n: int = 12) -> list[tuple[str, list[list[str]]]]:
    """Rows (user, sentences as word lists), shuffled: each user 1-4 rows of 1-3 sentences of 1-5 words."""
    rng = random.Random(seed)
    rows = [(f"u{u:02d}", [[rng.choice(KNOWN + UNKNOWN) for _ in range(rng.randint(1, 5))]
                           for _ in range(rng.randint(1, 3))])
            for u in range(n) for _ in range(rng.randint(1, 4))]
    rng.shuffle(rows)
    return rows


def _text(sentences: list[list[str]]) -> str:
    """Sentences written as a person would ("Alpha zeta. Beta."): the normaliser lower-cases them and
    makes "." a token, so a sentence of k words has k + 1 tokens."""
    return " ".join(" ".join(words).capitalize() + "." for words in sentences)


def write_data(tmp_path: Path, rows=None) -> tuple[Path, Path]:
    """The rows as JSON Lines and a word-count file of KNOWN and "." (data.path, data.vocab_path)."""
    rows = _users() if rows is None else rows
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    path = data / "rows.jsonl"
    path.write_text("".join(json.dumps({"author": u, "body": _text(s), "ts": i}) + "\n"
                            for i, (u, s) in enumerate(rows)))
    counts = data / "counts.txt"
    counts.write_text("".join(f"{w}\t{100 - i}\n" for i, w in enumerate([".", *KNOWN])))
    return path, counts


def overrides(path: Path, counts: Path | None, *more: str) -> list[str]:
    return ["data=files", f"data.path={path}", "data.user_column=author", "data.text_column=body",
            *([f"data.vocab_path={counts}"] if counts else []), f"data.max_sentences_per_user={CAP}",
            f"data.test_fraction={FRACTION}", "data.seq_len=12", *more]


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    return call_main(main, capsys, *argv)


def _snapshot(root: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*"))


def _direct(rows) -> dict:
    """The numbers inspect reports, counted here from the rows themselves."""
    by_user: dict[str, list[list[str]]] = {}
    row_count = Counter()
    for user, sentences in rows:  # file order
        by_user.setdefault(user, []).extend(sentences)
        row_count[user] += 1
    ids = sorted(by_user)
    test = {u for u, is_test in zip(ids, split_of(ids, FRACTION, 0)) if is_test}
    train = [u for u in ids if u not in test]
    kept = {u: by_user[u][:CAP] for u in train}
    tokens = {u: sum(len(s) + 1 for s in kept[u]) for u in train}
    unknown = sum(w in UNKNOWN for u in train for s in kept[u] for w in s)
    test_sentences = [s for user, sentences in rows if user in test for s in sentences]
    return {"train": train, "test": test, "kept": kept, "tokens": tokens, "all": by_user,
            "rows": (sum(row_count[u] for u in train), sum(row_count[u] for u in test)),
            "unknown_train": unknown / sum(tokens.values()),
            "unknown_test": sum(w in UNKNOWN for s in test_sentences for w in s) / sum(len(s) + 1 for s in
                                                                                         test_sentences),
            "test_sentences": len(test_sentences)}


# --- inspect ---------------------------------------------------------------------------------------

def test_inspects_test_unknown_share_is_the_one_the_run_publishes_when_rows_are_cut(tmp_path, capsys):
    """Under the word vocabulary a run counts the words of the rows it evaluates, cut to seq_len;
    inspect counts the same words (it counted whole sentences: 8.1% against the run's 8.5% on the
    real-text corpus)."""
    path, counts = write_data(tmp_path, _users())
    cut = [o for o in overrides(path, counts) if not o.startswith("data.seq_len=")] + ["data.seq_len=3"]
    code, out, err = run_main(capsys, "inspect", *cut, "--json")
    assert code == 0, err
    share = json.loads(out)["unknown_share"]["test"]
    whole = json.loads(run_main(capsys, "inspect", *overrides(path, counts), "--json")[1])["unknown_share"]["test"]
    assert share != pytest.approx(whole), "the fixture's test sentences are longer than 3 words"
    data = load_dataset(compose_cfg(*cut, run_dir=tmp_path / "never")["data"])
    assert data.test_unknown_share == pytest.approx(share, abs=1e-12)


def test_inspect_says_first_it_is_not_a_release_and_its_numbers_equal_a_direct_count(tmp_path, capsys):
    rows = _users()
    path, counts = write_data(tmp_path, rows)
    want = _direct(rows)
    assert want["test"] and len(want["train"]) > 5 and any(len(s) > CAP for s in want["all"].values())
    before = _snapshot(tmp_path / "data")

    code, out, err = run_main(capsys, "inspect", *overrides(path, counts), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert list(report)[0] == "notice" and "not a release" in report["notice"]
    assert report["users"]["train"] == len(want["train"]) == report["population"]
    assert report["users"]["test"] == len(want["test"])
    assert (report["rows"]["train"], report["rows"]["test"]) == want["rows"]
    assert report["test"]["sentences_evaluated"] == want["test_sentences"]
    per = report["per_train_user"]
    assert per["every_user"] and per["users_read"] == len(want["train"])
    sentences = [len(want["kept"][u]) for u in want["train"]]
    tokens = [want["tokens"][u] for u in want["train"]]
    assert per["sentences"] == files_inspect.quantiles(sentences) and per["sentences"]["max"] == CAP
    assert per["tokens"] == files_inspect.quantiles(tokens) and per["tokens"]["max"] == max(tokens)
    assert per["sentences_kept"] == sum(sentences)
    assert per["sentences_read"] == sum(len(want["all"][u]) for u in want["train"])
    assert report["unknown_share"]["train"] == pytest.approx(want["unknown_train"])
    assert report["unknown_share"]["test"] == pytest.approx(want["unknown_test"])
    assert report["data"]["columns"] == {"author": "string", "body": "string", "ts": "int64"}
    assert report["index"]["built_now"] and report["split"]["kind"] == "users"
    assert report["next"] == ("python -m fedpriv.simulate " + " ".join(overrides(path, counts))
                              + f" population={len(want['train'])} plan=auto privacy.target_epsilon=8")
    assert "needs at least 32 users" in report["next_problem"]  # the planner's own check, said on stderr too
    assert err.startswith("warning: the next command will not plan: population=") and len(err.splitlines()) == 1

    # the run loads what inspect said, from the cache inspect warmed
    data = load_dataset(compose_cfg(*overrides(path, counts), run_dir=tmp_path / "never")["data"])
    assert len(data.users) == report["population"] and len(data.test) == want["test_sentences"]
    assert data.test_unknown_share == pytest.approx(report["unknown_share"]["test"])
    assert sorted(len(data.users[i]) for i in range(len(data.users))) == sorted(sentences)

    code, out, err = run_main(capsys, "inspect", *overrides(path, counts))  # for a person; the index is cached
    lines = out.splitlines()
    assert code == 0 and lines[0] == files_inspect.NOTICE
    assert "not a release" in lines[0] and "nothing is written to a run directory" in lines[0]
    assert any(line.startswith("index: ") and "found in the cache" in line for line in lines)
    assert f"users: {len(want['train'])} train, {len(want['test'])} test" in out
    assert f"all {len(want['train'])} users" in out
    assert lines[-1] == f"next: {report['next']}"
    assert _snapshot(tmp_path / "data") == before  # nothing written next to the data
    assert not (tmp_path / "never").exists()


def test_per_user_numbers_come_from_a_seeded_sample_unless_all(tmp_path, capsys):
    path, counts = write_data(tmp_path, _users(n=30))
    spec = load_spec(path, counts)
    sampled = files_inspect.inspect_files(spec, sample=7)
    assert sampled["per_train_user"]["users_read"] == 7 and not sampled["per_train_user"]["every_user"]
    again = files_inspect.inspect_files(spec, sample=7)
    assert again | {"index": sampled["index"]} == sampled  # the same sample (seeded with data.seed)
    everyone = files_inspect.inspect_files(spec, every_user=True, sample=7)["per_train_user"]
    assert everyone["every_user"] and everyone["users_read"] == sampled["users"]["train"]
    assert sampled["per_train_user"]["sentences"]["max"] <= everyone["sentences"]["max"]
    line = files_inspect.lines(sampled)[6]
    assert "a sample of 7 users drawn with data.seed=0; --all reads every user" in line
    code, out, _ = run_main(capsys, "inspect", *overrides(path, counts), "--all", "--json")
    assert code == 0 and json.loads(out)["per_train_user"] == everyone


def load_spec(path: Path, counts: Path | None, *more: str):
    return run_config(compose_cfg(*overrides(path, counts, *more), run_dir="unused")).data


def test_a_split_column_counts_test_users_that_also_train(tmp_path, capsys):
    path = tmp_path / "data" / "rows.csv"
    path.parent.mkdir()
    path.write_text("author,body,part\na,Alpha beta.,train\na,Beta.,test\nb,Gamma.,test\nc,Delta.,train\n"
                    "c,Alpha.,validation\n")
    _, counts = write_data(tmp_path, [("x", [["alpha"]])])
    code, out, err = run_main(capsys, "inspect", *overrides(path, counts, "data.split_column=part"), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["users"] == {"train": 2, "test": 2, "test_also_train": 1, "max_users": None,
                               "train_before_max_users": 2}
    assert report["rows"] == {"train": 2, "test": 2} and report["split"]["ignored_rows"] == 1


def _corrupt(t: Path) -> Path:
    (t / "data").mkdir()
    (t / "data" / "bad.jsonl").write_text('{"author": "a", "body"\n')
    return t / "data" / "bad.jsonl"


def _rows_file(t: Path, text: str, name: str = "r.jsonl") -> Path:
    (t / "data").mkdir()
    (t / "data" / name).write_text(text)
    return t / "data" / name


# (data.path, extra overrides, what the one line must say)
BAD = {
    "missing file": (lambda t: t / "absent.jsonl", (), "no such file"),
    "corrupt file": (_corrupt, (), "cannot read"),
    "missing column": (lambda t: _rows_file(t, '{"user": "a", "body": "hi"}\n'), (),
                       "data.user_column='author' is not a column of"),
    "empty text": (lambda t: _rows_file(t, '{"author": "a", "body": "hi"}\n{"author": "b", "body": " "}\n'), (),
                   "empty text"),
    "mixed-type user column": (lambda t: _rows_file(t, '{"author": 1, "body": "a"}\n{"author": "x", "body": "b"}\n'),
                               (), "mixes value types"),
    "no train rows": (lambda t: _rows_file(t, '{"author": "a", "body": "hi", "s": "test"}\n'),
                      ("data.split_column=s",), "= 'train'"),
    "no public vocabulary": (lambda t: _rows_file(t, '{"author": "a", "body": "hi"}\n'), ("NO_VOCAB",),
                             NO_PUBLIC_TOKENIZATION),
    "not data=files": (lambda t: t, ("data=synthetic",), "inspect looks at your own files"),
    "a sweep": (lambda t: _rows_file(t, '{"author": "a", "body": "hi"}\n'), ("data.seed=1,2",), "not a sweep"),
    "an unknown flag": (lambda t: _rows_file(t, '{"author": "a", "body": "hi"}\n'), ("--sample",),
                        "'--sample' is not an option of inspect"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_every_bad_input_is_one_error_line_exit_2_and_nothing_written(case, tmp_path, capsys):
    make, extra, says = BAD[case]
    path = make(tmp_path)
    counts = tmp_path / "counts.txt"
    counts.write_text("alpha\t3\n")
    given = overrides(path, None if "NO_VOCAB" in extra else counts)
    if "data=synthetic" in extra:
        given = ["data=synthetic"]
    given += [e for e in extra if e not in ("NO_VOCAB", "data=synthetic")]
    data_before = _snapshot(tmp_path / "data") if (tmp_path / "data").is_dir() else None
    code, out, err = run_main(capsys, "inspect", *given)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and says in err, err
    if data_before is not None:
        assert _snapshot(tmp_path / "data") == data_before
    if case in ("missing file", "corrupt file"):  # no cache entry for data that does not read
        assert not list((tmp_path / "cache").glob("files/*"))


# --- word-counts -----------------------------------------------------------------------------------

def test_word_counts_round_trip_and_match_the_words_a_run_makes(tmp_path, capsys):
    rows = _users(seed=9)
    public = tmp_path / "public.jsonl.gz"
    with gzip.open(public, "wt") as f:  # the same sentences as public text, under another field name
        f.write("".join(json.dumps({"body": _text(s)}) + "\n" for _, s in rows))
    out = tmp_path / "counts.tsv"
    code, printed, err = run_main(capsys, "word-counts", str(public), "--text-field", "body", "--min-count", "2",
                                  "-o", str(out))
    assert code == 0, err
    want = Counter(w for _, sentences in rows for s in sentences for w in [*s, "."])
    kept = sorted(((w, n) for w, n in want.items() if n >= 2), key=lambda wn: (-wn[1], wn[0]))
    assert out.read_text() == "".join(f"{w}\t{n}\n" for w, n in kept)
    assert read_word_counts(out, None, "data.vocab_path") == [w for w, _ in kept]
    assert read_word_counts(out, 3, "data.vocab_path") == [w for w, _ in kept[:3]]
    assert f"data.vocab_path={out}" in printed
    (tmp_path / "data").mkdir()
    path, _ = write_data(tmp_path, rows)  # a run's words are all in it: nothing maps to the unknown token
    code, printed, err = run_main(capsys, "inspect", *overrides(path, out), "--json")
    assert code == 0, err
    assert json.loads(printed)["unknown_share"] == {"train": 0.0, "test": 0.0}


def test_word_counts_never_replaces_a_file_unless_forced(tmp_path, capsys):
    public = tmp_path / "public.txt"
    public.write_text("One two. Two!\n")
    out = tmp_path / "counts.txt"
    out.write_text("old\t1\n")
    code, printed, err = run_main(capsys, "word-counts", str(public), "-o", str(out), "--min-count", "1")
    assert code == 2 and printed == "" and len(err.splitlines()) == 1 and "already exists" in err
    assert out.read_text() == "old\t1\n"
    code, _, err = run_main(capsys, "word-counts", str(public), "-o", str(out), "--min-count", "1", "--force")
    assert code == 0, err
    assert out.read_text() == "two\t2\n!\t1\n.\t1\none\t1\n"


@pytest.mark.parametrize("make,args,says", [
    (lambda t: t / "absent.txt", (), "no public text files"),
    (lambda t: (t / "bad.jsonl").write_text('{"text": 1}\n') and t / "bad.jsonl", (), "no string field 'text'"),
    (lambda t: (t / "bad.txt.gz").write_bytes(b"not gzip") and t / "bad.txt.gz", (), "cannot read"),
    (lambda t: (t / "latin.txt").write_bytes(b"caf\xe9\n") and t / "latin.txt", (), "not UTF-8"),
    (lambda t: (t / "p.txt").write_text("a b c\n") and t / "p.txt", ("--min-count", "2"), "no word occurs 2 times"),
    (lambda t: (t / "p.txt").write_text("a\n") and t / "p.txt", ("--min-count", "0"), "--min-count must be"),
])
def test_word_counts_bad_input_is_one_error_line_and_no_file(tmp_path, capsys, make, args, says):
    public = make(tmp_path)
    out = tmp_path / "counts.txt"
    code, printed, err = run_main(capsys, "word-counts", str(public), *args, "-o", str(out))
    assert code == 2 and printed == "" and len(err.splitlines()) == 1 and err.startswith("error: ")
    assert says in err, err
    assert not out.exists()


# --- the real command (two subprocesses) ---------------------------------------------------------------

def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FEDPRIV_CACHE": str(tmp_path / "cache"),
           "HOME": str(tmp_path / "home"), "FLWR_TELEMETRY_ENABLED": "0"}
    return run_module("fedpriv.data", *args, cwd=tmp_path / "cwd", env=env, timeout=180)


def test_the_command_prints_the_notice_first_and_refuses_bad_input_in_one_line(tmp_path):
    path, counts = write_data(tmp_path, _users(n=120))  # enough users for plan=auto's default budget: no warning
    done = _cli(tmp_path, "inspect", *overrides(path, counts))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == files_inspect.NOTICE and done.stderr == ""
    last = done.stdout.splitlines()[-1]
    assert last.startswith("next: python -m fedpriv.simulate data=files") and "plan=auto" in last
    population = int(last.split("population=")[1].split()[0])
    assert check_overrides(shlex.split(last)[4:])[0][1]["population"] == population >= 32  # it parses as a run's
    (tmp_path / "x").mkdir()
    bad = _cli(tmp_path, "inspect", *overrides(_corrupt(tmp_path / "x"), counts))
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.splitlines()) == 1 and bad.stderr.startswith("error: cannot read"), bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_txt_directory_is_inspected_with_its_file_and_text_columns(tmp_path, capsys):
    data = tmp_path / "data" / "users"
    (data / "team").mkdir(parents=True)
    lines = {f"team/u{i}.txt" if i % 2 else f"u{i}.txt": i + 1 for i in range(10)}  # the user ids, and rows
    for i, (name, n) in enumerate(lines.items()):
        (data / name).write_text("\n".join(f"Alpha beta {i}." for _ in range(n)) + "\n\n")  # blank lines: no row
    _, counts = write_data(tmp_path, [("x", [["alpha"]])])
    given = ["data=files", f"data.path={data}", "data.user_column=file", "data.text_column=text",
             f"data.vocab_path={counts}", f"data.test_fraction={FRACTION}"]
    code, out, err = run_main(capsys, "inspect", *given, "--json")
    assert code == 0, err
    report = json.loads(out)
    names = sorted(lines)
    test = split_of(names, FRACTION, 0)
    assert report["users"]["train"] == int((~test).sum()) and report["users"]["test"] == int(test.sum())
    assert report["rows"] == {"train": sum(lines[n] for n, t in zip(names, test) if not t),
                              "test": sum(lines[n] for n, t in zip(names, test) if t)}
    assert report["data"]["columns"] == {"file": "string", "text": "string"}
    assert np.isclose(report["unknown_share"]["train"], 1 / 4)  # "alpha beta <i> ." : the number is unknown
