"""Builds a federated real-text corpus, offline, from English prose written by people on this machine.

Users' text: change-log entries (``/usr/share/doc/*/changelog*.gz``) in three formats: Debian
(the uploader's bullets, or those of a team upload's ``[ Name ]`` section; lists of upstream changes
quoted under a bare URL line, e.g. the kernel's stable updates, are not the uploader's and are
dropped), GNU ChangeLog (``DATE  Name  <email>`` headers) and git log (``Author:``). A user is an
author within one package (``--user author-package``, the default: a person active in several
packages is several users) or a person (``--user author``). Automated committers (bots, Weblate,
the Debian Janitor) are left out; an entry repeated in another file counts once.

Vocabulary: PUBLIC, counted from a disjoint source, the English manual pages
(``/usr/share/man/man[1-8]/*`` without the ``gcloud*`` pages, generated from templates): no
change-log text is counted, and a file given as both is an error. ``stackoverflow.word_count``
lists every token seen at least twice, most frequent first (ties: alphabetical), as TFF's file.

Preprocessing as TFF's StackOverflow (its ``load_data`` documentation): HTML unescaped, non-ASCII
dropped (accents folded first), lower-cased, punctuation split into tokens except apostrophes and
hyphens inside words, URLs replaced by one token. Also replaced by one token each: e-mail addresses
``<email>``, file paths ``<path>``, version strings ``<version>``, commit hashes ``<hash>``, numbers
of 3+ digits ``<num>``, identifiers with ``_``/``::``/``()`` ``<code>``, command-line options
``<option>``. Code-like lines and trailers (``Signed-off-by:``) are dropped; sentences are split at
``.!?`` before a capital, at bullets and blank lines; a sentence needs 3 plain words making 60% of
its tokens.

Splits as TFF's file: ``heldout`` holds all of one user in ten (client id % 10 == 0); the others'
entries dated before ``--cutoff-year`` are ``train``, later ones ``test`` (TFF: before/after
2018-01-01). Users with fewer than ``--min-sentences`` sentences are left out (TFF: 100); a user
keeps the first ``--max-sentences`` of the test and heldout splits (the reader's train cap: no single
user fills the uniform test subset; train is whole, capped when read). Client ids: 16 hex digits of
the SHA-256 of the user's normalised name.

Output, under ``--out`` (default ``outputs/real_text/``): ``users.jsonl`` (JSON Lines, one row per
sentence ``{"user": client id, "split": train|test|heldout, "text": its tokens separated by spaces}``,
the rows of the sqlite file in its order), ``stackoverflow.sqlite`` (the same rows in TFF's schema,
by :func:`fedpriv.data.stackoverflow_writer.write_examples`, with ``client_metadata`` and an index),
``stackoverflow.word_count`` beside them (the public vocabulary of both), and ``manifest.json``
(sources' names, sizes and digests, statistics, the outputs' digests), written last. The same
machine gives the same files byte for byte. Read the JSON Lines with ``data=files`` (the sentences
are already tokenized: ``preprocess=none``; ``heldout`` rows are ignored, as TFF's loader ignores
them)::

    python -m fedpriv.simulate data=files data.path=OUT/users.jsonl data.user_column=user \
        data.text_column=text data.split_column=split data.preprocess=none \
        data.vocab_path=OUT/stackoverflow.word_count

and the sqlite file, the same users and rows, with
``python -m fedpriv.simulate data=stackoverflow data.path=OUT/stackoverflow.sqlite``.

Usage: ``python scripts/build_real_text_corpus.py [--out DIR] [--user author] [--cutoff-year 2022] ...``
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import gzip
import hashlib
import html
import json
import os
import re
import sys
import time
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from fedpriv.release.atomic import write_atomic  # noqa: E402
from fedpriv.release.console import OneLineParser, fail  # noqa: E402
from fedpriv.data.stackoverflow_writer import VOCAB_FILE_NAME, write_examples  # noqa: E402
from fedpriv.errors import OutputError  # noqa: E402

CHANGELOGS = "/usr/share/doc/*/changelog*.gz"
MANPAGES = "/usr/share/man/man[1-8]/*"
MANPAGES_EXCLUDE = "gcloud*"  # the Google Cloud SDK's pages are generated from templates (16,631 here)
SQLITE_NAME = "stackoverflow.sqlite"
JSONL_NAME = "users.jsonl"  # the same rows as JSON Lines, for data=files
PUBLIC_NAME = "public.txt"  # the manual pages' sentences, one a line: public text (data.public_source=text)
MANIFEST_NAME = "manifest.json"
MIN_WORDS = 3  # a sentence needs this many plain words
MIN_WORD_SHARE = 0.6  # ... and this share of its tokens must be plain words
CUTOFF_YEAR = 2022  # entries dated from this year on are test (here 572 users, 7% of the sentences)
MIN_SENTENCES = 3  # users with fewer sentences are left out (TFF: fewer than 100)
# a user's sentences kept in test and heldout (the reader's default train cap): no one user fills the
# uniform test subset
MAX_SENTENCES = 256
USER_UNITS = ("author-package", "author")  # who one user is: see user_key
HELDOUT_MOD = 10  # one user in HELDOUT_MOD goes to the heldout split (TFF: user_id % 10 == 0)
# automated committers: their messages are not written by a person
_BOT = re.compile(r"\bbot\b|\[bot\]|weblate|renovate|dependabot|janitor|autobuild|buildd|github|gitlab", re.I)

# --- change-log entries ---------------------------------------------------------------------------

_YEAR = re.compile(r"\b(19[7-9]\d|20[0-4]\d)\b")
_DEB_HEADER = re.compile(r"^[a-z0-9][a-z0-9+.-]*\s+\([^)]*\)\s+[^;]*;\s*urgency=", re.I)
_DEB_TRAILER = re.compile(r"^ -- (.+?)\s*<[^>]*>\s+(.*)$")
_DEB_SECTION = re.compile(r"^\s+\[\s*([^\]]+?)\s*\]\s*$")
_DEB_TOP_BULLET = re.compile(r"^ {1,3}\* ")
_GIT_COMMIT = re.compile(r"^commit [0-9a-f]{7,40}\b")
_GIT_AUTHOR = re.compile(r"^Author:\s*(.+?)\s*<[^>]*>\s*$")
_GIT_DATE = re.compile(r"^Date:\s+(.*)$")
# GNU ChangeLog headers: "2020-01-31  Name  <email>" or "Mon Jan 16 14:30:00 PDT 2017  Name  <email>"
_GNU_HEADER = re.compile(r"^(\d{4}-\d{2}-\d{2}|[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d [\d:]+(?: [A-Z]{3,4})? \d{4})"
                         r"\s+(.+?)\s+<[^>]*>")
_TRAILER_LINE = re.compile(r"^\s*[A-Z][A-Za-z-]+(?:-[Bb]y|-[Ii][Dd])?:\s")  # Signed-off-by:, Closes: ...


@dataclass(frozen=True)
class Entry:
    """One change-log entry: who wrote it, the year it was dated, its text lines."""

    author: str
    year: int
    lines: tuple[str, ...]


def author_key(name: str) -> str:
    """A name as one user: accents folded, case folded, whitespace and quotes collapsed."""
    name = unicodedata.normalize("NFKC", name).strip().strip("\"'")
    return " ".join(name.casefold().split())


def _year(text: str) -> int | None:
    match = _YEAR.search(text)
    return int(match.group(1)) if match else None


def parse_changelog(text: str) -> list[Entry]:
    """The entries of one change log in any of the three formats (see the module docstring), in
    file order; a Debian entry with ``[ Name ]`` sections gives one entry per section author."""
    entries: list[Entry] = []
    author: str | None = None  # GNU and git: the current entry's author
    year: int | None = None
    body: list[str] = []
    deb: dict[str | None, list[str]] | None = None  # open Debian entry: section author -> lines
    section: str | None = None
    quoting = False  # inside a list of upstream changes quoted under a bare URL line

    def close() -> None:
        nonlocal author, year, body
        if author and year and body:
            entries.append(Entry(author, year, tuple(body)))
        author, year, body = None, None, []

    for line in text.splitlines():
        if deb is not None:
            trailer = _DEB_TRAILER.match(line)
            if trailer:
                uploader, when = trailer.group(1), _year(trailer.group(2))
                for who, lines in deb.items():
                    if lines and when:
                        entries.append(Entry(who or uploader, when, tuple(lines)))
                deb = None
                continue
            named = _DEB_SECTION.match(line)
            if named:
                section, quoting = named.group(1), False
                continue
            if _DEB_TOP_BULLET.match(line):
                quoting = False
            elif _URL.fullmatch(line.strip()):
                quoting = True
            if not quoting:
                deb.setdefault(section, []).append(line)
            continue
        if _DEB_HEADER.match(line):
            close()
            deb, section, quoting = {}, None, False
        elif _GIT_COMMIT.match(line):
            close()
        elif (git_author := _GIT_AUTHOR.match(line)) and not body:
            author = git_author.group(1)
        elif (git_date := _GIT_DATE.match(line)) and not body and author:
            year = _year(git_date.group(1))
        elif gnu := _GNU_HEADER.match(line):
            close()
            author, year = gnu.group(2), _year(gnu.group(1))
        elif author:
            body.append(line)
    close()
    return entries


# --- text to sentences ----------------------------------------------------------------------------

_URL = re.compile(r"\b(?:https?|ftp|git|svn)://\S+|\bwww\.\S+", re.I)
_EMAIL = re.compile(r"<?[\w.+-]+@[\w-]+(?:\.[\w-]+)+>?")
_HASH = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
_VERSION = re.compile(r"\b[vV]?\d+(?:[.:~+]\w+)+(?:-[\w.~+]+)?\b|\b\d+-\d+[a-z]\w*\b")
_PATH = re.compile(r"(?<![\w<])(?:~|\.{1,2})?/?(?:[\w.+-]+/)+[\w.+*-]*|(?<![\w<])/[\w.+-]+")
_FILE = re.compile(r"\b[\w+-]+\.(?:c|h|cc|cpp|hpp|py|pl|pm|sh|in|am|ac|m4|texi|md|txt|xml|json|ya?ml|rs|go|js"
                   r"|patch|diff|conf|so|mk|cmake|pc|install|docs|rules|control|lintian-overrides)\b")
_NUMBER = re.compile(r"#?\b\d{3,}\b")
_CODE_WORD = re.compile(r"\b\w+::\w+(?:\(\))?|\b\w*_\w*(?:\(\))?|\b\w+\(\)")  # identifiers, calls
_OPTION = re.compile(r"(?<![\w-])--?[a-zA-Z][\w-]*")  # command-line options
_GNU_FILES = re.compile(r"^\*\s*[\w./+*,{} -]+?(?:\s*\([^)]*\))?\s*:\s+")  # "* src/a.c (fn):" prefix
_GNU_FUNCS = re.compile(r"^\([^)]*\):\s+")  # "(fn, gn):" continuation prefix
_BULLET = re.compile(r"^([*+-]|\d+[.)])\s+")
_CODE = re.compile(r"[{};]\s*$|==|!=|->|::|&&|\|\||\$\(|^\s*(?:#include|#define|if \(|for \(|return\b)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
_TOKEN = re.compile(r"<(?:url|email|version|path|hash|num|code|option)>|[a-z0-9]+(?:['-][a-z0-9]+)*|[^\sa-z0-9]")
_WORD = re.compile(r"^[a-z]+(?:['-][a-z]+)*$")


def paragraphs(lines: Iterable[str]) -> list[str]:
    """Bullet items and blank-line separated paragraphs, each joined into one line, GNU file
    prefixes and bullet marks removed; code-like lines and trailers (``Signed-off-by:``) dropped."""
    out: list[list[str]] = [[]]
    for raw in lines:
        line = raw.strip()
        if not line or _TRAILER_LINE.match(raw) or _CODE.search(line):
            out.append([])
            continue
        stripped = _GNU_FUNCS.sub("", _GNU_FILES.sub("", line))
        if stripped != line or _BULLET.match(line):
            out.append([])
            line = _BULLET.sub("", stripped)
        out[-1].append(line)
    return [" ".join(p) for p in out if p]


def tokenize(text: str) -> list[str]:
    """TFF's StackOverflow preprocessing of one sentence, plus this corpus's placeholders."""
    text = html.unescape(text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    for pattern, token in ((_URL, " <url> "), (_EMAIL, " <email> "), (_HASH, " <hash> "),
                           (_PATH, " <path> "), (_FILE, " <path> "), (_VERSION, " <version> "),
                           (_NUMBER, " <num> "), (_CODE_WORD, " <code> "), (_OPTION, " <option> ")):
        text = pattern.sub(token, text)
    return _TOKEN.findall(text.lower())


def sentences(lines: Iterable[str]) -> list[str]:
    """The kept sentences of some text lines, each as space-separated tokens."""
    kept = []
    for paragraph in paragraphs(lines):
        for sentence in _SENTENCE_END.split(paragraph):
            tokens = tokenize(sentence)
            words = sum(1 for t in tokens if _WORD.match(t))
            if words >= MIN_WORDS and words >= MIN_WORD_SHARE * len(tokens):
                kept.append(" ".join(tokens))
    return kept


# --- manual pages (the vocabulary's source) --------------------------------------------------------

_ROFF_ESCAPE = re.compile(r"\\f(?:\[[^\]]*\]|\(..|.)|\\s[+-]?\d+|\\\*?(?:\(..|\[[^\]]*\])|\\[&|^%:,/]|\\.")
_ROFF_TEXT_MACRO = re.compile(r"^\.(?:B|I|BR|RB|IR|RI|BI|IB|SM|SB|SH|SS|TP|IP|HP|PP|LP|P|Nm|Nd|Sh|Ss|Em|Pp)\b\s*")


def manpage_lines(text: str) -> list[str]:
    """The prose lines of a roff manual page: requests and comments dropped (the text arguments of
    font and heading macros kept), escapes removed; a ``.so`` redirect has none."""
    lines = []
    for line in text.splitlines():
        if line.startswith(".so "):
            return []
        if line.startswith((".", "'")):
            macro = _ROFF_TEXT_MACRO.match(line)
            if not macro:
                lines.append("")
                continue
            line = line[macro.end():].replace('"', "")
        lines.append(_ROFF_ESCAPE.sub(lambda m: "-" if m.group(0) == "\\-" else "", line))
    return lines


# --- sources, users, splits -----------------------------------------------------------------------


def read_text(path: Path) -> str:
    """A source file's text (gunzipped if ``.gz``; undecodable bytes replaced)."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode("utf-8", "replace")


def unique_files(pattern: str, exclude: str | None = None) -> list[Path]:
    """The regular files ``pattern`` matches (but not those whose name matches the glob ``exclude``),
    sorted, each content once (copies under several package names are common)."""
    seen: set[str] = set()
    files = []
    for name in sorted(glob.glob(pattern)):
        path = Path(name)
        if not path.is_file() or (exclude and fnmatch.fnmatch(path.name, exclude)):
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest not in seen:
            seen.add(digest)
            files.append(path)
    return files


def client_id(key: str) -> str:
    """A user's pseudonymous id: 16 hex digits of the SHA-256 of the normalised name."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def user_key(author: str, path: Path, unit: str) -> str:
    """Who a user is: the author (``unit="author"``: a person), or the author within one package
    (``"author-package"``: a person's entries in one package's change log, the package directory's
    name; a person active in several packages is several users)."""
    return author if unit == "author" else f"{author}\t{path.parent.name}"


def collect_users(files: Sequence[Path], unit: str = "author") -> tuple[dict[str, list[tuple[int, str]]], Counter]:
    """``client id -> [(year, sentence)]`` over the change logs (in file then entry order; an entry
    repeated in another file counted once) and counts of what was dropped."""
    users: dict[str, list[tuple[int, str]]] = defaultdict(list)
    seen: set[tuple[str, int, tuple[str, ...]]] = set()
    dropped: Counter = Counter()
    for path in files:
        for entry in parse_changelog(read_text(path)):
            key = author_key(entry.author)
            if not key or _BOT.search(key):
                dropped["entries by automated authors"] += 1
                continue
            marker = (key, entry.year, tuple(line.strip() for line in entry.lines))
            if marker in seen:
                dropped["repeated entries"] += 1
                continue
            seen.add(marker)
            users[client_id(user_key(key, path, unit))].extend((entry.year, s) for s in sentences(entry.lines))
    return users, dropped


def split_rows(users: dict[str, list[tuple[int, str]]], cutoff_year: int, min_sentences: int,
               max_sentences: int = MAX_SENTENCES) -> list[tuple[str, str, str]]:
    """``(split, client_id, tokens)`` rows, TFF-style: one user in ten whole in ``heldout``; the
    others' sentences dated before ``cutoff_year`` in ``train``, the rest in ``test``. Users with
    fewer than ``min_sentences`` sentences are left out; a user keeps the first ``max_sentences`` of
    each evaluation split (0: all; train is whole, the reader caps it). Rows by split, client id, then
    source order."""
    rows = []
    for cid in sorted(users):
        pairs = users[cid]
        if len(pairs) < min_sentences:
            continue
        kept: Counter = Counter()
        for year, text in pairs:
            split = ("heldout" if int(cid, 16) % HELDOUT_MOD == 0 else
                     "train" if year < cutoff_year else "test")
            if split == "train" or not max_sentences or kept[split] < max_sentences:
                kept[split] += 1
                rows.append((split, cid, text))
    order = {"train": 0, "heldout": 1, "test": 2}
    return sorted(rows, key=lambda row: (order[row[0]], row[1]))  # stable: source order kept


def public_sentences(files: Sequence[Path]) -> list[str]:
    """The kept sentences of the manual pages (the users' preprocessing), in file order: the public
    text the vocabulary is counted on, and what a run may pre-train on (``public.txt``)."""
    return [sentence for path in files for sentence in sentences(manpage_lines(read_text(path)))]


def count_vocabulary(files: Sequence[Path]) -> Counter:
    """Token counts over the kept sentences of the manual pages (the same preprocessing)."""
    counts: Counter = Counter()
    for sentence in public_sentences(files):
        counts.update(sentence.split())
    return counts


def word_count_text(counts: Counter, min_count: int = 2) -> str:
    """TFF's ``word<TAB>count`` lines, most frequent first, ties alphabetical."""
    ranked = sorted((w, c) for w, c in counts.items() if c >= min_count)
    ranked.sort(key=lambda item: -item[1])
    return "".join(f"{w}\t{c}\n" for w, c in ranked)


def _sources(files: Sequence[Path]) -> dict:
    """Names and sizes of a source's files, with one digest over their contents."""
    digest = hashlib.sha256()
    listed = []
    for path in files:
        data = path.read_bytes()
        digest.update(f"{path}\0{len(data)}\0".encode() + hashlib.sha256(data).digest())
        listed.append([str(path), len(data)])
    return {"files": len(files), "bytes": sum(size for _, size in listed), "sha256": digest.hexdigest(),
            "listing": listed}


def _stats(rows: Sequence[tuple[str, str, str]]) -> dict:
    stats: dict = {}
    for split in ("train", "heldout", "test"):
        per_user = Counter(cid for s, cid, _ in rows if s == split)
        sizes = sorted(per_user.values())
        stats[split] = {
            "users": len(per_user), "sentences": sum(sizes),
            "tokens": sum(len(t.split()) for s, _, t in rows if s == split),
            "sentences_per_user": {q: sizes[min(len(sizes) - 1, int(f * len(sizes)))] if sizes else 0
                                   for q, f in (("min", 0), ("p10", .1), ("median", .5), ("p90", .9),
                                                ("p99", .99), ("max", 1))},
        }
    return stats


def jsonl_text(rows: Sequence[tuple[str, str, str]]) -> str:
    """``(split, client_id, tokens)`` rows as JSON Lines ``{"user", "split", "text"}``, in their order."""
    return "".join(json.dumps({"user": cid, "split": split, "text": text}) + "\n" for split, cid, text in rows)


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(changelogs: Sequence[Path], manpages: Sequence[Path], out: Path, *, cutoff_year: int = CUTOFF_YEAR,
          min_sentences: int = MIN_SENTENCES, max_sentences: int = MAX_SENTENCES,
          unit: str = USER_UNITS[0]) -> dict:
    """Writes the corpus under ``out`` (sqlite, JSON Lines, word counts, manifest last) and returns the manifest.
    Raises ``ValueError`` (one line) when a source is empty or shared, or no user is left."""
    if not changelogs:
        raise ValueError("no change-log files to take users from")
    if not manpages:
        raise ValueError("no manual pages to count the public vocabulary from")
    user_digests = {_file_sha256(p) for p in changelogs}
    shared = [str(p) for p in manpages if _file_sha256(p) in user_digests]
    if shared:
        raise ValueError(f"the vocabulary's source is not disjoint from the users' text: {shared[0]}")
    users, dropped = collect_users(changelogs, unit)
    rows = split_rows(users, cutoff_year, min_sentences, max_sentences)
    if not any(split == "train" for split, _, _ in rows):
        raise ValueError(f"no user has {min_sentences} sentences before {cutoff_year}")
    counts = count_vocabulary(manpages)
    vocab = word_count_text(counts)
    out.mkdir(parents=True, exist_ok=True)
    db = out / SQLITE_NAME
    tmp = out / f".{SQLITE_NAME}.tmp"
    tmp.unlink(missing_ok=True)
    (out / MANIFEST_NAME).unlink(missing_ok=True)  # a manifest only beside the files it describes
    try:
        write_examples(tmp, rows, metadata=True, index=True)
        write_atomic(out / VOCAB_FILE_NAME, vocab.encode())
        write_atomic(out / JSONL_NAME, jsonl_text(rows).encode())
        write_atomic(out / PUBLIC_NAME, "".join(f"{line}\n" for line in public_sentences(manpages)).encode())
        os.replace(tmp, db)
    finally:
        tmp.unlink(missing_ok=True)
    train_words = Counter(w for s, _, t in rows if s == "train" for w in t.split())
    top = [line.split("\t")[0] for line in vocab.splitlines()[:10000]]
    manifest = {
        "what": "federated real-text corpus in TFF's StackOverflow schema and as JSON Lines "
                "(scripts/build_real_text_corpus.py)",
        "users_source": {"kind": "change-log entries", "user": unit, **_sources(changelogs)},
        "vocabulary_source": {"kind": "English manual pages (disjoint from the users' text)", **_sources(manpages)},
        "cutoff_year": cutoff_year, "min_sentences": min_sentences, "max_sentences": max_sentences,
        "heldout": f"client id % {HELDOUT_MOD} == 0",
        "dropped": dict(sorted(dropped.items())),
        "users": len({cid for _, cid, _ in rows}),
        "splits": _stats(rows),
        "vocabulary": {"words": len(vocab.splitlines()),
                       "train_token_coverage_top10000": round(
                           sum(train_words[w] for w in top) / max(1, sum(train_words.values())), 4)},
        "outputs": {name: {"bytes": (out / name).stat().st_size, "sha256": _file_sha256(out / name)}
                    for name in (SQLITE_NAME, JSONL_NAME, VOCAB_FILE_NAME, PUBLIC_NAME)},
    }
    write_atomic(out / MANIFEST_NAME, (json.dumps(manifest, indent=1) + "\n").encode())
    return manifest


def main(argv: Sequence[str] | None = None) -> None:
    parser = OneLineParser(description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("outputs/real_text"), help="output directory")
    parser.add_argument("--changelogs", default=CHANGELOGS, help="glob of the users' change logs")
    parser.add_argument("--manpages", default=MANPAGES, help="glob of the vocabulary's manual pages")
    parser.add_argument("--manpages-exclude", default=MANPAGES_EXCLUDE, help="glob of page names left out")
    parser.add_argument("--cutoff-year", type=int, default=CUTOFF_YEAR, help="entries from this year on are test")
    parser.add_argument("--min-sentences", type=int, default=MIN_SENTENCES, help="users with fewer are left out")
    parser.add_argument("--max-sentences", type=int, default=MAX_SENTENCES,
                        help="a user's sentences kept in test and heldout (0: all)")
    parser.add_argument("--user", choices=USER_UNITS, default=USER_UNITS[0], help="who one user is (user_key)")
    args = parser.parse_args(argv)
    if args.min_sentences < 1 or args.max_sentences < 0:
        fail(f"--min-sentences must be >= 1 and --max-sentences >= 0, got {args.min_sentences}, "
             f"{args.max_sentences}")
    started = time.monotonic()
    try:
        manifest = build(unique_files(args.changelogs), unique_files(args.manpages, args.manpages_exclude), args.out,
                         cutoff_year=args.cutoff_year, min_sentences=args.min_sentences,
                         max_sentences=args.max_sentences, unit=args.user)
    except (ValueError, OutputError) as err:
        fail(str(err))
    except OSError as err:  # e.g. --out names a file
        fail(f"cannot write under {args.out}: {err.strerror or err}")
    splits = manifest["splits"]
    print(json.dumps({"out": str(args.out), "splits": {k: {n: v for n, v in s.items() if n != "sentences_per_user"}
                                                       for k, s in splits.items()},
                      "vocabulary_words": manifest["vocabulary"]["words"],
                      "build_seconds": round(time.monotonic() - started, 1)}))


if __name__ == "__main__":
    main()
