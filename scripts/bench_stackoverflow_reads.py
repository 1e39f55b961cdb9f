"""Reading StackOverflow users from a file without a client index, through the row map
(fedpriv/data/stackoverflow_rowmap.py), on a generated TFF-schema file.

    .venv/bin/python scripts/bench_stackoverflow_reads.py --rows 400000 --users 20000 --layout shuffled

Times, as medians over ``--repeats``:

- first load: ``load_stackoverflow`` with an empty ``$FEDPRIV_CACHE`` (the one pass that builds the
  map, plus the vocabulary and the test subset), and the pass alone (``build_row_map``);
- later load: ``load_stackoverflow`` again, the map read from the cache;
- a round: ``--round`` distinct random users read (and preprocessed: decoded, mapped to ids) on a
  freshly loaded dataset (no user in the LRU cache), as a training round does;
- for contrast, a few user reads the old way (``WHERE client_id = ?``: a full-table scan each).

The file is generated once (``--keep PATH`` reuses or keeps it) and is hot in the OS page cache, as
after the generation; a cold first read of the real file adds its I/O (see docs/BENCHMARKS.md).
Prints one JSON object (also written to ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedpriv.data import stackoverflow_rowmap  # noqa: E402
from fedpriv.data.stackoverflow import VOCAB_FILE_NAME, SqliteUsers, _connect, load_stackoverflow  # noqa: E402
from fedpriv.data.stackoverflow_writer import write_examples  # noqa: E402

WORDS = ("how to sort a list in python i do it with the of for and is this that error when can not my "
         "file use code get value not set data function string").split()


def generate(path: Path, rows: int, users: int, layout: str, seed: int = 0) -> None:
    """``rows`` sentences over ``users`` client ids (8 digits, like TFF's), 90% train / 10% test,
    grouped by client (TFF's layout) or shuffled."""
    rng = random.Random(seed)
    table = []
    for _ in range(rows):
        u = rng.randrange(users)
        split = "test" if rng.random() < 0.1 else "train"
        table.append((split, f"{u:08d}", " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 25)))))
    if layout == "contiguous":
        table.sort(key=lambda r: (r[1], r[0]))
    write_examples(path, table)
    path.with_name(VOCAB_FILE_NAME).write_text("".join(f"{w}\t{1000 - k}\n" for k, w in enumerate(WORDS)))


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--layout", choices=["shuffled", "contiguous"], default="shuffled")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--round", type=int, default=100, help="users read per round")
    parser.add_argument("--scan-reads", type=int, default=3, help="user reads timed the old way (a scan each)")
    parser.add_argument("--keep", type=Path, default=None, help="the generated file: reused if it exists")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-so-"))
    path = args.keep or work / "stackoverflow.sqlite"
    generate_s = 0.0
    if not path.exists():
        generate_s, _ = timed(lambda: generate(path, args.rows, args.users, args.layout))
    load = dict(vocab_size=10_000, seq_len=20, max_sentences_per_user=256, max_test_sentences=10_000)

    first, passes, later, rounds, sentences = [], [], [], [], []
    for r in range(args.repeats):
        os.environ["FEDPRIV_CACHE"] = str(work / f"cache{r}")  # empty: the first load builds the map
        with closing(_connect(path)) as conn:
            passes.append(timed(lambda: stackoverflow_rowmap.build_row_map(conn))[0])
        t, data = timed(lambda: load_stackoverflow(path, **load))
        first.append(t)
        t, data = timed(lambda: load_stackoverflow(path, **load))
        later.append(t)
        assert data.info["row_map"], "the file has a client index: nothing to measure"
        picked = random.Random(r).sample(range(len(data.users)), min(args.round, len(data.users)))
        t, arrays = timed(lambda users=data.users, picked=picked: [users[i] for i in picked])
        rounds.append(t)
        sentences.append(sum(len(a) for a in arrays))
    with closing(_connect(path)) as conn:
        m = stackoverflow_rowmap.build_row_map(conn)
        rows = conn.execute("SELECT COUNT(*) FROM examples").fetchone()[0]
    entry = next(Path(os.environ["FEDPRIV_CACHE"]).glob("stackoverflow/rowmap-*.pt"))

    scan = SqliteUsers(path, data.users.client_ids, data.vocab, 20, 256)  # no runs: WHERE client_id = ?
    scan_s = [timed(lambda i=i: scan[i])[0] for i in random.Random(99).sample(range(len(scan)), args.scan_reads)]

    result = {
        "rows": rows,
        "train_users": len(m.train_ids),
        "layout": args.layout,
        "file_mb": round(path.stat().st_size / 1e6, 1),
        "generate_s": round(generate_s, 1),
        "repeats": args.repeats,
        "map_pass_s": round(statistics.median(passes), 3),
        "first_load_s": round(statistics.median(first), 3),
        "later_load_s": round(statistics.median(later), 3),
        "round_users": len(picked),
        "round_s": round(statistics.median(rounds), 3),
        "round_sentences": int(statistics.median(sentences)),
        "train_ranges": len(m.starts),
        "test_ranges": len(m.test_starts),
        "map_mb": round(m.nbytes / 1e6, 2),
        "cache_entry_mb": round(entry.stat().st_size / 1e6, 2),
        "scan_read_ms_per_user": round(1000 * statistics.median(scan_s), 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "all_first_load_s": [round(x, 3) for x in first],
        "all_later_load_s": [round(x, 3) for x in later],
        "all_round_s": [round(x, 3) for x in rounds],
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    if not args.keep:
        for p in sorted(work.rglob("*"), key=lambda p: -len(p.parts)):
            p.rmdir() if p.is_dir() else p.unlink()
        work.rmdir()


if __name__ == "__main__":
    main()
