"""A data owner's look at ``data=files`` before training (``python -m fedpriv.data inspect``).

:func:`inspect_files` opens ``data.path`` exactly as a run does (:func:`fedpriv.data.files.open_reading`:
the same checks and refusals; the conversion and the index are built now or found in the cache,
so the run that follows starts warm) and says what the run will see: the files and their columns,
the index, the test split and how it was made, the train and test users and rows, sentences and
tokens per train user (quantiles), and the share of words the chosen vocabulary or tokenizer maps
to its unknown token, on the train users read and on the test sentences the run evaluates.

It is the owner's own view of private data, **not a release**: every number here is a statistic
of the users' text that no privacy guarantee covers. It is printed for the owner and written
nowhere (no run directory, no key drawn; only the data cache a run would fill anyway). Per-user
statistics come from a uniform sample of :data:`SAMPLE_USERS` train users drawn with ``data.seed``
(a seeded numpy draw, :func:`fedpriv.data.word_rows.test_subset`: it picks what the owner looks
at, no randomness a guarantee relies on), or from every user with ``every_user``.

Definitions. A user's *sentences* are those a run makes of its rows (``data.preprocess``), of
which the first ``data.max_sentences_per_user`` are kept (trained on); its *tokens* are the tokens
of its kept sentences as the chosen tokenizer splits them (words under ``tokenizer=word``), before
rows are cut to ``data.seq_len``. The *unknown share* is
:func:`fedpriv.text.tokenizers.unknown_word_share` — the share of words that reach the model as no
known token — over the kept sentences of the train users read, and over the evaluated test
sentences exactly as a run publishes it (``test_unknown_share``: under the word vocabulary the
words of the rows cut to ``data.seq_len``) and checks it (every test word unknown is refused, above
a quarter warned).
Quantiles are observed values (``numpy.quantile(method="inverted_cdf")``).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import fedpriv.data.files_source as files_source

import fedpriv.data.word_rows as word_rows
from fedpriv.data.files import FilesData, Opened, encoding_of, held_out_sentences, open_reading, user_sentences
from fedpriv.data.files_index import TEST_SPLIT_KEY
from fedpriv.data.files_source import SAVE_TO_DISK
from fedpriv.text.tokenizers import WordTokenizer, unknown_share_of_counts

NOTICE = ("fedpriv data inspect: your own view of your private data, not a release — share none of it; "
          "nothing is written to a run directory")
SAMPLE_USERS = 2000  # train users read for the per-user statistics, unless every user is asked for
QUANTILES = (("p10", 0.10), ("median", 0.50), ("p90", 0.90), ("p99", 0.99))


def quantiles(values: Any) -> dict[str, int]:
    """p10, median, p90, p99 (observed values: ``inverted_cdf``) and max of ``values`` (integers)."""
    a = np.asarray(values, dtype=np.int64)
    out = {name: int(np.quantile(a, q, method="inverted_cdf")) for name, q in QUANTILES}
    out["max"] = int(a.max())
    return out


def _bytes_of(source: files_source.FilesSource) -> int:
    if source.kind == SAVE_TO_DISK:
        return sum(f.stat().st_size for f in Path(source.files[0]).rglob("*") if f.is_file())
    return sum(f.stat().st_size for f in source.files)


def _distinct(values: pa.Array | pa.ChunkedArray, like: pa.Array) -> pa.Array:
    """The distinct non-null ``values``, cast to the type of the index ids ``like``."""
    unique = pc.unique(values)
    unique = unique.combine_chunks() if isinstance(unique, pa.ChunkedArray) else unique
    return pc.drop_null(unique).cast(like.type)


def _test_users(opened: Opened, user: str) -> tuple[int, int | None]:
    """(test users, how many of them have train rows too; None where that cannot happen)."""
    source, index = opened.source, opened.index
    if source.split == "users":
        return len(opened.test_users), None
    if source.split == "column":
        column = source.train.data.table.column(user).take(pa.array(index.test_rows, type=pa.int64()))
    else:
        column = source.test.data.table.column(user) if source.test is not None else pa.array([], index.ids.type)
    ids = _distinct(column, index.ids)
    both = pc.sum(pc.is_in(ids, value_set=index.ids.take(pa.array(opened.numbers)))).as_py() or 0
    return len(ids), int(both)


def _test_rows(opened: Opened) -> int:
    source, index = opened.source, opened.index
    if source.split == "users":
        return int(np.diff(index.offsets)[opened.test_users].sum())
    if source.split == "column":
        return len(index.test_rows)
    return 0 if source.test is None else len(source.test)


def _split(spec: FilesData, opened: Opened) -> dict[str, Any]:
    source, index = opened.source, opened.index
    if source.split == "users":
        rule = (f"no data.split_column: whole users held out by the public rule BLAKE2b(user id; key "
                f"{TEST_SPLIT_KEY.decode()}, split_seed {spec.split_seed}) < data.test_fraction {spec.test_fraction:g}")
        return {"kind": "users", "rule": rule, "test_fraction": spec.test_fraction, "split_seed": spec.split_seed}
    if source.split == "column":
        ignored = index.rows - int(index.offsets[-1]) - len(index.test_rows)
        rule = (f"data.split_column {spec.split_column!r}: rows whose value is 'train' are trained on, 'test' "
                f"evaluated, any other ignored ({ignored:,} rows ignored); a user may have rows on both sides")
        return {"kind": "column", "rule": rule, "column": spec.split_column, "ignored_rows": ignored}
    rule = "the DatasetDict's splits: 'train' trained on, 'test' evaluated, any other ignored"
    return {"kind": "dict", "rule": rule}


def _tokenization(spec: FilesData, encoding) -> dict[str, Any]:
    tok = encoding.tokenizer
    if tok is None:
        words = len(encoding.vocab.words or ())
        return {"tokenizer": "word", "vocab_path": str(spec.vocab_path), "vocab_size": words,
                "described": f"the first {words:,} words of {spec.vocab_path} (data.tokenizer=word, data.vocab_size="
                             f"{spec.vocab_size})"}
    if spec.tokenizer == "sentencepiece":
        described = (f"SentencePiece ({spec.sp_model_type}, {tok.size:,} pieces) trained on the public corpus "
                     f"data.public_source={spec.public_source} data.public_path={spec.public_path} (data.tokenizer="
                     "sentencepiece)")
    else:
        described = f"the Hugging Face tokenizer of {spec.tokenizer_path} ({tok.size:,} tokens; data.tokenizer=hf)"
    return {"tokenizer": spec.tokenizer, "size": tok.size, "seq_len": encoding.seq_len, "described": described}


def inspect_files(spec: FilesData, every_user: bool = False, sample: int = SAMPLE_USERS) -> dict[str, Any]:
    """What a run of the data option ``spec`` will see (the module docstring), as a JSON-ready dict
    (``population``: the train users, what ``plan=auto`` needs as ``population=N``). Refuses, in one
    :class:`~fedpriv.errors.ConfigError` line, what a run refuses."""
    began = time.monotonic()
    reading = spec.reading()
    spec.check_public_tokenization()
    opened = open_reading(reading)
    seconds = time.monotonic() - began
    source, index = opened.source, opened.index
    encoding = encoding_of(spec)
    encoder = encoding.tokenizer if encoding.tokenizer is not None else WordTokenizer(encoding.vocab.words or ())
    test_texts = held_out_sentences(opened, reading, spec.max_test_sentences, spec.seed)
    test_share = encoding.test_unknown_share(test_texts, spec.tokenizer)  # as the run publishes and checks it

    users = len(opened.numbers)
    chosen = np.arange(users, dtype=np.int64) if every_user else word_rows.test_subset(users, sample, spec.seed)
    cap = spec.max_sentences_per_user
    pieces: dict[str, int] = {}
    counts: Counter[str] = Counter()
    sentences, tokens, total = [], [], 0
    for i in chosen.tolist():
        got = user_sentences(opened, reading, i)
        kept = got[:cap]
        total += len(got)
        words = Counter(w for s in kept for w in s.split())
        if encoding.tokenizer is None:
            n = sum(words.values())
        else:
            n = sum(c * (pieces[w] if w in pieces else pieces.setdefault(w, len(encoder.encode_word(w))))
                    for w, c in words.items())
        counts.update(words)
        sentences.append(len(kept))
        tokens.append(n)
    test_users, in_both = _test_users(opened, reading.user_column)
    test_rows = _test_rows(opened)
    all_train = (len(index) - len(opened.test_users)) if opened.test_users is not None else len(index)
    return {
        "notice": NOTICE,
        "data": {"path": reading.path, "format": files_source.DESCRIBED[source.kind], "files": len(source.files),
                 "bytes": _bytes_of(source), "columns": dict(source.columns)},
        "index": {"entry": str(source.entry), "path": str(index.path), "rows": index.rows,
                  "converted_now": source.converted, "built_now": index.built_seconds is not None,
                  "seconds": round(seconds, 3)},
        "split": _split(spec, opened),
        "users": {"train": users, "test": test_users, "test_also_train": in_both,
                  "max_users": spec.max_users, "train_before_max_users": all_train},
        "rows": {"train": int(np.diff(index.offsets)[opened.numbers].sum()), "test": test_rows},
        "test": {"rows_evaluated": min(test_rows, spec.max_test_sentences), "sentences_evaluated": len(test_texts),
                 "max_test_sentences": spec.max_test_sentences},
        "per_train_user": {"users_read": len(chosen), "every_user": len(chosen) == users,
                           "sample_seed": None if len(chosen) == users else spec.seed,
                           "sentences": quantiles(sentences), "tokens": quantiles(tokens),
                           "sentences_read": total, "sentences_kept": int(sum(sentences)),
                           "max_sentences_per_user": cap},
        "tokenization": _tokenization(spec, encoding),
        "unknown_share": {"train": unknown_share_of_counts(encoder, counts), "test": test_share},
        "population": users,
    }


def _share(x: float | None) -> str:
    return "no word" if x is None else f"{x:.1%}"


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _q(values: dict[str, int]) -> str:
    return " / ".join(f"{name} {values[name]:,}" for name in ("p10", "median", "p90", "p99", "max"))


def lines(report: dict[str, Any]) -> list[str]:
    """The report of :func:`inspect_files` for a person, :data:`NOTICE` first (``next``: the command
    to run next, where the caller added it)."""
    d, ix, sp, us, rows = report["data"], report["index"], report["split"], report["users"], report["rows"]
    test, per, tok, unk = report["test"], report["per_train_user"], report["tokenization"], report["unknown_share"]
    columns = ", ".join(f"{name} ({kind})" for name, kind in d["columns"].items())
    files = "" if d["format"] == files_source.DESCRIBED[SAVE_TO_DISK] else f", {d['files']:,} file" + (
        "s" if d["files"] != 1 else "")
    if ix["built_now"]:
        made = (f"built now in {ix['seconds']:.2f} s over {ix['rows']:,} rows"
                + (", the conversion to Arrow too" if ix["converted_now"] else ""))
    else:
        made = f"found in the cache: {ix['rows']:,} rows, opened in {ix['seconds']:.2f} s"
    also = "" if us["test_also_train"] is None else f"; {us['test_also_train']:,} of them have train rows too"
    capped = "" if us["max_users"] is None or us["train"] == us["train_before_max_users"] else (
        f" (the first {us['train']:,} of {us['train_before_max_users']:,}: data.max_users)")
    who = (f"all {per['users_read']:,} users" if per["every_user"] else
           f"a sample of {per['users_read']:,} users drawn with data.seed={per['sample_seed']}; --all reads every user")
    left = per["sentences_read"] - per["sentences_kept"]
    held = ("a test user is never trained on; its text is evaluated, outside epsilon" if sp["kind"] == "users"
            else "test rows are evaluated, outside epsilon")
    out = [
        report["notice"],
        f"data: {d['path']} ({d['format']}{files}, {_size(d['bytes'])}), columns: {columns}",
        f"index: {ix['path']} ({made}; cached by content, owner-only: it holds a copy of your text)",
        f"split: {sp['rule']}",
        f"users: {us['train']:,} train{capped}, {us['test']:,} test{also} ({held})",
        f"rows: train {rows['train']:,}, test {rows['test']:,} (the run evaluates a uniform subset of at most "
        f"{test['max_test_sentences']:,} test rows: {test['rows_evaluated']:,} rows, {test['sentences_evaluated']:,} "
        "sentences)",
        f"per train user ({who}): sentences {_q(per['sentences'])} (the first {per['max_sentences_per_user']:,} "
        f"kept: {left:,} of {per['sentences_read']:,} left out); tokens {_q(per['tokens'])}",
        f"tokenization: {tok['described']}; unknown token: {_share(unk['train'])} of the train words read, "
        f"{_share(unk['test'])} of the test words evaluated",
    ]
    if report.get("next"):
        out.append(f"next: {report['next']}")
    return out
