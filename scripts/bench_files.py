"""``data=files`` at StackOverflow's size: a generated file of ``--users`` users (342,477, TFF's
train users) and ``--rows`` rows in no particular order, loaded and trained on for 3 rounds of 100
users, and the memory of reading users.

    .venv/bin/python scripts/bench_files.py --out /tmp/files_bench --json docs/bench/files_scale.json

What it does, each step timed on its own:

1. **generate** (once; ``--out`` keeps it: a later call reuses it) ``rows.jsonl`` — one JSON object
   a row, ``{"user": "<8 digits>", "text": "..."}``, rows shuffled over users — and, with
   ``--parquet``, the same rows as ``rows.parquet``; ``word_counts.txt``, the generator's own word
   list by rank (TFF's ``word<TAB>count``: a *public* vocabulary, counted on no row). Users get
   a log-normal number of rows (median ≈ 7, a long tail, as StackOverflow's), each row one to three
   sentences of 3 to 25 words drawn from a Zipf law over 30,000 words.
2. **run, cold**: ``python -m fedpriv.simulate data=files ... cohort_size=100 rounds=3 eval_every=3``
   (the default LSTM) with an empty ``$FEDPRIV_CACHE``: the first load converts the file to Arrow and
   indexes it by user (cached by content), then 3 rounds and one evaluation; wall time and the
   process's peak resident memory (``ru_maxrss`` of the child).
3. **run, warm**: the same command again (the cache hit).
4. **users read**: in this process, the dataset loaded from the warm cache, then 1,000, 10,000 and
   50,000 distinct users read (as cohorts read them); the resident memory after each, split into
   anonymous memory and file-backed pages (``/proc/self/status``: RssAnon, RssFile) — flat in the
   users read is the claim (file-backed pages are the memory-mapped Arrow file, which the kernel
   may drop at any time).

Prints one JSON object (also written to ``--json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORDS = 30_000  # the generator's word list: "w0" (the most frequent) .. "w29999"


def generate(out: Path, users: int, rows: int, seed: int, parquet: bool) -> dict:
    """Write ``rows.jsonl`` (and ``rows.parquet``) and ``word_counts.txt`` under ``out``; returns
    what was written. Rows are shuffled: a user's rows are spread over the whole file."""
    import numpy as np  # lazy: the module's docstring is its --help

    rng = np.random.default_rng(seed)
    sizes = np.maximum(1, np.round(rng.lognormal(mean=math.log(7.0), sigma=1.0, size=users))).astype(np.int64)
    sizes = np.maximum(1, np.round(sizes * (rows / sizes.sum()))).astype(np.int64)  # about `rows` rows in all
    owner = np.repeat(np.arange(users, dtype=np.int64), sizes)
    rng.shuffle(owner)
    ranks = np.arange(1, WORDS + 1, dtype=np.float64)
    weights = 1.0 / ranks
    weights /= weights.sum()
    cumulative = np.cumsum(weights)
    vocab = np.array([f"w{i}" for i in range(WORDS)], dtype=object)
    ids = np.array([f"{u:08d}" for u in rng.permutation(100_000_000)[:users]], dtype=object)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    texts: list[str] = []
    chunk = 200_000
    with open(out / "rows.jsonl.tmp", "w") as f:
        for start in range(0, len(owner), chunk):
            block = owner[start:start + chunk]
            sentences = rng.integers(1, 4, size=len(block))
            lengths = rng.integers(3, 26, size=int(sentences.sum()))
            words = np.searchsorted(cumulative, rng.random(int(lengths.sum())))
            words = np.minimum(words, WORDS - 1)
            cut = np.cumsum(lengths)[:-1]
            made = [" ".join(vocab[s]) for s in np.split(words, cut)]
            ends = np.cumsum(sentences)
            begins = ends - sentences
            lines = []
            for u, b, e in zip(block, begins, ends):
                text = ". ".join(made[b:e]) + "."
                lines.append(json.dumps({"user": ids[u], "text": text}))
                if parquet:
                    texts.append(text)
            f.write("\n".join(lines) + "\n")
    os.replace(out / "rows.jsonl.tmp", out / "rows.jsonl")
    if parquet:
        import pyarrow as pa  # lazy: only with --parquet
        import pyarrow.parquet as pq

        table = pa.table({"user": pa.array(ids[owner].tolist(), pa.string()), "text": pa.array(texts, pa.string())})
        pq.write_table(table, out / "rows.parquet.tmp", row_group_size=1 << 20)
        os.replace(out / "rows.parquet.tmp", out / "rows.parquet")
    expected = np.round(weights * 1e9).astype(np.int64)  # the law's counts, not the rows': public
    (out / "word_counts.txt").write_text("".join(f"{vocab[i]}\t{expected[i]}\n" for i in range(WORDS)))
    return {"users": users, "rows": int(len(owner)), "seconds": time.perf_counter() - started,
            "jsonl_mb": (out / "rows.jsonl").stat().st_size / 2**20,
            "parquet_mb": (out / "rows.parquet").stat().st_size / 2**20 if parquet else None}


def run(out: Path, data: Path, cache: Path, name: str, extra: list[str]) -> dict:
    """One ``fedpriv.simulate`` run on ``data`` with ``$FEDPRIV_CACHE=cache``: wall time, peak RSS,
    the result lines."""
    run_dir = out / f"run_{name}"
    command = [sys.executable, "-m", "fedpriv.simulate", "data=files", f"data.path={data}", "data.user_column=user",
               "data.text_column=text", f"data.vocab_path={out / 'word_counts.txt'}", "cohort_size=100", "rounds=3",
               "eval_every=3", "progress=false", f"run_dir={run_dir}", *extra]
    env = {**os.environ, "FEDPRIV_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    logs = out / f"run_{name}.log"
    started = time.perf_counter()
    with open(logs, "w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak resident memory
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = logs.read_text().strip().splitlines()
    if proc.returncode != 0:
        raise SystemExit(f"error: the {name} run failed ({proc.returncode}): {' | '.join(lines[-5:])}")
    return {"wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024, "command": " ".join(command[1:]),
            "output_tail": lines[-3:]}


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def users_read(out: Path, data: Path, cache: Path, counts: list[int], seed: int) -> list[dict]:
    """Load the dataset in this process (warm cache) and read ``counts`` distinct users, cumulatively;
    the resident memory after each."""
    os.environ["FEDPRIV_CACHE"] = str(cache)
    from fedpriv.schema import load  # lazy: after FEDPRIV_CACHE is set

    option = load("data", {"name": "files", "path": str(data), "user_column": "user", "text_column": "text",
                           "vocab_path": str(out / "word_counts.txt")})
    started = time.perf_counter()
    dataset = option.load_words()
    rows = [{"users_read": 0, "seconds": time.perf_counter() - started, "rss_anon_mb": _status_mb("RssAnon"),
             "rss_file_mb": _status_mb("RssFile")}]
    order = list(range(len(dataset.users)))
    random.Random(seed).shuffle(order)
    done = 0
    for count in counts:
        count = min(count, len(order))
        started = time.perf_counter()
        for u in order[done:count]:
            dataset.users[u]
        rows.append({"users_read": count, "seconds": time.perf_counter() - started,
                     "rss_anon_mb": _status_mb("RssAnon"), "rss_file_mb": _status_mb("RssFile")})
        done = count
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the generated file, caches and runs go")
    parser.add_argument("--users", type=int, default=342_477)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parquet", action="store_true", help="also write and run the Parquet form")
    parser.add_argument("--read", type=int, nargs="*", default=[1_000, 10_000, 50_000],
                        help="users read in the memory step (cumulative)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    result: dict = {"threads": os.environ.get("OMP_NUM_THREADS"), "cpus": os.cpu_count()}
    data = args.out / "rows.jsonl"
    if not data.exists():
        result["generate"] = generate(args.out, args.users, args.rows, args.seed, args.parquet)
    forms = [("jsonl", data)] + ([("parquet", args.out / "rows.parquet")] if args.parquet else [])
    for form, path in forms:
        with tempfile.TemporaryDirectory(dir=args.out) as cache:
            result[f"{form}_cold"] = run(args.out, path, Path(cache), f"{form}_cold", [])
            result[f"{form}_warm"] = run(args.out, path, Path(cache), f"{form}_warm", [])
            if form == "jsonl":
                result["users_read"] = users_read(args.out, path, Path(cache), args.read, args.seed)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
