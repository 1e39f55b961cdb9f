"""scripts/build_real_text_corpus.py on change logs and manual pages the test writes: the three
change-log formats give their authors' sentences, the vocabulary comes from the manual pages only,
fedpriv's StackOverflow reader reads the result, ``data=files`` reads its JSON Lines copy as the
same users and test rows, and the build is deterministic."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sqlite3
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fedpriv import schema
from fedpriv.data.stackoverflow import load_stackoverflow
from fedpriv.data.stackoverflow_writer import VOCAB_FILE_NAME
from fedpriv.data.tf_example import decode_example
from fedpriv.text.corpora import public_word_counts

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "build_real_text_corpus.py"

DEBIAN = """\
hello (2.1-1) unstable; urgency=medium

  * New upstream release, see https://example.org/hello for details.
  * New upstream stable update:
    https://www.kernel.org/pub/linux/kernel/v6.x/ChangeLog-6.1.181
    - net: fix a leak in the socket layer that others wrote
  * Fix the manual page of the greeting command.

 -- Alice Example <alice@example.org>  Mon, 02 Jan 2024 10:00:00 +0100

hello (2.0-1) unstable; urgency=medium

  [ Bob Builder ]
  * Rewrite the packaging so that the greeting works again.
    It was broken by version 1.9.3-2 of the library.

  [ Alice Example ]
  * Add a zebrafish option to the greeting program.

 -- Alice Example <alice@example.org>  Tue, 03 Mar 2020 10:00:00 +0100
"""

GNU = """\
2019-05-01  Carol Writer  <carol@example.org>

\t* src/hello.c (main): Print the greeting twice when asked politely.
\tReported by dave@example.net in the usual way.

2018-01-02  Carol Writer  <carol@example.org>

\t* hello.c: Remove the old greeting code path entirely.
"""

GIT = """\
commit 0123456789abcdef0123456789abcdef01234567
Author: Dave Hacker <dave@example.net>
Date:   Fri Feb 4 12:00:00 2022 +0000

    Make the greeting shorter and friendlier for everyone.

    Signed-off-by: Dave Hacker <dave@example.net>

commit 89abcdef0123456789abcdef0123456789abcdef
Author: dependabot[bot] <support@github.com>
Date:   Fri Feb 4 12:00:00 2022 +0000

    Bump the action version to the latest one available.
"""

MANPAGE = """\
.TH HELLO 1
.SH NAME
hello \\- print a friendly greeting
.SH DESCRIPTION
.B hello
prints a friendly greeting to the terminal.
The greeting is friendly and the terminal shows the greeting.
.\\" a comment with words that never count
"""


def _script():
    spec = importlib.util.spec_from_file_location("build_real_text_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _gz(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode(), mtime=0))
    return path


@pytest.fixture
def sources(tmp_path):
    doc = tmp_path / "doc"
    logs = [_gz(doc / "hello" / "changelog.Debian.gz", DEBIAN), _gz(doc / "hello" / "changelog.gz", GNU),
            _gz(doc / "libhello1" / "changelog.gz", GIT), _gz(doc / "hello-copy" / "changelog.Debian.gz", DEBIAN)]
    pages = [_gz(tmp_path / "man" / "man1" / "hello.1.gz", MANPAGE)]
    return logs, pages


def _rows(db: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(db) as con:
        return [(split, cid, decode_example(blob)["tokens"][0].decode())
                for split, cid, blob in con.execute("SELECT * FROM examples ORDER BY rowid")]


def test_users_are_the_authors_with_their_own_sentences(sources):
    b = _script()
    logs, _ = sources
    users, dropped = b.collect_users(b.unique_files(str(logs[0].parents[1] / "*" / "changelog*.gz")), "author")
    cid = b.client_id
    assert users[cid("alice example")] == [
        (2024, "new upstream release , see <url> for details ."),
        (2024, "new upstream stable update :"),  # not the upstream changes it quotes
        (2024, "fix the manual page of the greeting command ."),
        (2020, "add a zebrafish option to the greeting program ."),
    ]
    assert users[cid("bob builder")] == [
        (2020, "rewrite the packaging so that the greeting works again ."),
        (2020, "it was broken by version <version> of the library ."),
    ]
    assert users[cid("carol writer")] == [
        (2019, "print the greeting twice when asked politely ."),
        (2019, "reported by <email> in the usual way ."),
        (2018, "remove the old greeting code path entirely ."),
    ]
    assert users[cid("dave hacker")] == [(2022, "make the greeting shorter and friendlier for everyone .")]
    assert len(users) == 4  # the bot's commit is not a user
    assert dropped["entries by automated authors"] == 1
    # the copy under another package is one file (same bytes), so nothing is read twice
    per_package, _ = b.collect_users(b.unique_files(str(logs[0].parents[1] / "*" / "changelog*.gz")),
                                     "author-package")
    assert per_package[cid(b.user_key("carol writer", logs[1], "author-package"))] == users[cid("carol writer")]


def test_the_corpus_is_read_by_fedpriv_with_a_vocabulary_from_the_manual_pages(sources, tmp_path):
    b = _script()
    logs, pages = sources
    out = tmp_path / "out"
    manifest = b.build(logs, pages, out, cutoff_year=2023, min_sentences=2, unit="author")
    rows = _rows(out / b.SQLITE_NAME)
    cids = {name: b.client_id(name) for name in ("alice example", "bob builder", "carol writer", "dave hacker")}
    assert cids["dave hacker"] not in {cid for _, cid, _ in rows}  # one sentence < min_sentences
    heldout = {name for name, cid in cids.items() if int(cid, 16) % 10 == 0}
    expect_test = [] if "alice example" in heldout else [
        ("test", cids["alice example"], "new upstream release , see <url> for details ."),
        ("test", cids["alice example"], "new upstream stable update :"),
        ("test", cids["alice example"], "fix the manual page of the greeting command .")]
    assert [r for r in rows if r[0] == "test"] == expect_test  # 2024 >= cutoff: test, as TFF's date split
    train_users = sorted(cid for name, cid in cids.items() if name != "dave hacker" and name not in heldout)
    data = load_stackoverflow(out / b.SQLITE_NAME, vocab_size=50, seq_len=8)
    assert list(data.users.client_ids) == train_users
    assert data.info["vocab_source"] == str(out / VOCAB_FILE_NAME)
    words = [line.split("\t")[0] for line in (out / VOCAB_FILE_NAME).read_text().splitlines()]
    assert words[:3] == ["greeting", "the", "friendly"]  # counts from the manual page only, ties alphabetical
    assert "zebrafish" not in words and "comment" not in words  # change-log words and roff comments never count
    assert manifest["vocabulary_source"]["files"] == 1
    assert manifest["splits"]["train"]["users"] == len(train_users)
    on_disk = json.loads((out / b.MANIFEST_NAME).read_text())
    assert on_disk["outputs"][b.SQLITE_NAME]["sha256"] == manifest["outputs"][b.SQLITE_NAME]["sha256"]
    # public.txt: the manual pages' sentences, the text the vocabulary was counted on (issue 55's
    # public corpus, data.public_source=text), holding no change-log sentence
    public = (out / b.PUBLIC_NAME).read_text().splitlines()
    counted = Counter(w for line in public for w in line.split())
    vocab = {w: int(c) for w, c in (line.split("\t") for line in (out / VOCAB_FILE_NAME).read_text().splitlines())}
    assert public and vocab == {w: c for w, c in counted.items() if c >= 2}  # the word counts' min_count is 2
    assert not {t for _, _, t in rows} & set(public)
    assert public_word_counts(out / b.PUBLIC_NAME)  # what data.public_source=text reads


def test_the_json_lines_read_by_data_files_give_the_sqlite_users_and_test_rows(sources, tmp_path, monkeypatch):
    """users.jsonl holds the sqlite file's rows (heldout ones too, in its order); data=files reads it
    (split column, preprocess=none, the same word counts) as data=stackoverflow reads the sqlite:
    the same train users in the same order with the same rows, the same test rows and vocabulary.
    The heldout split is in neither: data=files ignores a split that is neither train nor test, as
    TFF's loader ignores heldout."""
    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    b = _script()
    logs, pages = sources
    out = tmp_path / "out"
    b.build(logs, pages, out, cutoff_year=2023, min_sentences=2, unit="author")
    rows = _rows(out / b.SQLITE_NAME)
    lines = [json.loads(line) for line in (out / b.JSONL_NAME).read_text().splitlines()]
    assert [(r["split"], r["user"], r["text"]) for r in lines] == rows
    assert {split for split, _, _ in rows} == {"train", "test", "heldout"}  # carol writer's id ends in 0
    heldout = {cid for split, cid, _ in rows if split == "heldout"}
    common = {"vocab_size": 50, "seq_len": 8, "max_test_sentences": 5, "seed": 3}
    so = schema.load("data", {"name": "stackoverflow", "path": str(out / b.SQLITE_NAME), **common}).load_words()
    files = schema.load("data", {"name": "files", "path": str(out / b.JSONL_NAME), "user_column": "user",
                                 "text_column": "text", "split_column": "split", "preprocess": "none",
                                 "vocab_path": str(out / VOCAB_FILE_NAME), **common}).load_words()
    opened = files.users._handle()
    ids = [opened.index.id_of(int(n)) for n in opened.numbers]
    assert ids == list(so.users.client_ids) and not heldout & set(ids)
    for i in range(len(ids)):
        np.testing.assert_array_equal(files.users[i], so.users[i])
    tests = sum(split == "test" for split, _, _ in rows)
    assert files.test.shape[0] == so.test.shape[0] == tests  # the heldout rows are not test rows
    np.testing.assert_array_equal(files.test, so.test)
    assert files.vocab == so.vocab
    assert not (tmp_path / "home").exists()  # nothing under HOME (the cache is FEDPRIV_CACHE's)


def test_placeholders_and_the_per_user_cap():
    b = _script()
    assert b.tokenize("Use foo_bar() with --force in src/x.c, see 1a2b3c4d and #123456.") == [
        "use", "<code>", "with", "<option>", "in", "<path>", ",", "see", "<hash>", "and", "<num>", "."]
    rows = b.split_rows({"00000000000000a1": [(2020, "a b c")] * 5 + [(2024, "d e f")] * 3}, 2023, 1, 2)
    assert rows == [("train", "00000000000000a1", "a b c")] * 5 + [("test", "00000000000000a1", "d e f")] * 2


def test_the_build_is_deterministic(sources, tmp_path):
    b = _script()
    logs, pages = sources
    first = b.build(logs, pages, tmp_path / "a", min_sentences=1)
    second = b.build(logs, pages, tmp_path / "b", min_sentences=1)
    for name in (b.SQLITE_NAME, b.JSONL_NAME, VOCAB_FILE_NAME, b.PUBLIC_NAME):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert name in first["outputs"]
    assert first["outputs"] == second["outputs"]


def test_a_vocabulary_source_that_is_user_text_is_refused_and_nothing_is_written(sources, tmp_path, capsys):
    b = _script()
    logs, pages = sources
    with pytest.raises(ValueError, match="not disjoint"):
        b.build(logs, [*pages, logs[2]], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as exit_info:
        b.main(["--changelogs", str(tmp_path / "none" / "*.gz"), "--manpages", str(pages[0]),
                "--out", str(tmp_path / "cli")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no change-log files")
    assert not (tmp_path / "cli").exists()
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        b.main(["--changelogs", str(logs[0]), "--manpages", str(pages[0]), "--out", str(tmp_path / "a-file")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: cannot write under {tmp_path / 'a-file'}")
