"""Paper-scale round benchmark: the per-client loop vs cohort-parallel local training, per device.

    python scripts/bench_scale.py [--setting stackoverflow|default] [--rounds 2] [--parallel 10]
                                  [--warmup 1] [--devices cpu,cuda] [--json PATH]

* ``stackoverflow``: a TFF-schema sqlite generated here (``--users`` users whose sentence counts
  follow a heavy-tailed law capped at 256, as TFF's preprocessing caps StackOverflow users;
  sentences of Zipf-distributed words over a 10,000-word ``stackoverflow.word_count``), read by
  fedpriv's StackOverflow loader with ``+experiment=stackoverflow``: the 4,050,748-parameter
  LSTM, 100 clients per round, one full local epoch of batch-16 SGD each.
* ``default``: the default experiment (synthetic users, the small LSTM, 150 clients, 2 steps).

Per round and device, in one process: the cohort's local updates by the loop (``client.parallel=1``)
and by cohort-parallel chunks (``client.parallel=K``), alternated, every delta checked against
the loop's (relative error ≤ 1e-4); then the server's side of the round (clip, sum, noise,
optimizer, EMA) once. Medians are printed and, with ``--json``, written.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fedpriv.compose import compose_config  # noqa: E402
from fedpriv.data.stackoverflow_writer import write_examples  # noqa: E402
from fedpriv.research_key import client_randomness  # noqa: E402
from fedpriv.clients import client_updates  # noqa: E402
from fedpriv.replies import ClientReplies  # noqa: E402
from fedpriv.runner import prepare  # noqa: E402
from fedpriv.config import run_config  # noqa: E402
from fedpriv.task import load_task  # noqa: E402

WORDS = 10_000


def write_stackoverflow_like(folder: Path, users: int, seed: int = 0) -> Path:
    """``stackoverflow.sqlite`` and ``stackoverflow.word_count`` in ``folder``. Sentence counts per
    user: ``min(256, ⌈LogNormal(log 100, 1.2)⌉)`` (median 100; about 22% of users at the 256 cap);
    sentence lengths: 4 + Poisson(10) words; words: Zipf(1.1) ranks over the vocabulary."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{k}" for k in range(WORDS)]
    (folder / "stackoverflow.word_count").write_text("".join(f"{w}\t{WORDS - k}\n" for k, w in enumerate(vocab)))
    ranks = np.arange(1, WORDS + 1, dtype=np.float64)
    p = ranks ** -1.1
    p /= p.sum()

    def sentence() -> str:
        return " ".join(vocab[i] for i in rng.choice(WORDS, size=4 + rng.poisson(10), p=p))

    sizes = np.minimum(256, np.ceil(rng.lognormal(np.log(100), 1.2, size=users))).astype(int)
    rows = [("train", f"u{u:06d}", sentence()) for u in range(users) for _ in range(sizes[u])]
    rows += [("test", f"t{k % 50}", sentence()) for k in range(500)]
    return write_examples(folder / "stackoverflow.sqlite", rows, index=True)


def overrides(setting: str, folder: Path, rounds: int) -> list[str]:
    common = ["progress=false", f"rounds={rounds}", "sampling=fixed", "eval_every=100000",
              "privacy.noise_multiplier=1.0", "diagnostics=false"]
    if setting == "default":
        return common
    return ["+experiment=stackoverflow", f"data.path={folder / 'stackoverflow.sqlite'}",
            "data.max_test_sentences=100", *common]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=["stackoverflow", "default"], default="stackoverflow")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds per device")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (1: round 0)")
    parser.add_argument("--parallel", type=int, default=10, help="clients per cohort-parallel chunk")
    parser.add_argument("--users", type=int, default=1000, help="users in the generated sqlite")
    parser.add_argument("--devices", default="cpu,cuda", help="comma-separated; cuda is skipped where absent")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.setting == "stackoverflow":
            write_stackoverflow_like(folder, args.users)
        for device in args.devices.split(","):
            if device == "cuda" and not torch.cuda.is_available():
                print("cuda: not available here, skipped")
                continue
            results.append(bench_device(args, folder, device))
    out = {"date": date.today().isoformat(), "setting": args.setting, "parallel": args.parallel,
           "threads": args.threads, "torch": torch.__version__, "results": results}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


def bench_device(args: argparse.Namespace, folder: Path, device: str) -> dict:
    base = overrides(args.setting, folder, args.rounds + args.warmup) + [f"device={device}"]
    loop_cfg = compose_config(base, folder / f"run-{device}-loop")
    par_cfg = compose_config(base + [f"client.parallel={args.parallel}", "client.parallel_on_cpu=true"],
                             folder / f"run-{device}-par")
    session = prepare(par_cfg)  # the server side (sampler, mechanism, optimizer) of the parallel config
    loop_task, par_task = load_task(run_config(loop_cfg)), session.task
    rng = client_randomness(session.cfg)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    loop_s, par_s, server_s, rows, worst = [], [], [], [], 0.0
    for r in range(args.rounds + args.warmup):  # the first `warmup` rounds are not timed
        cohort = session.server.cohort(r)
        users = [int(u) for u in cohort]
        params = session.server.params
        timed = {}
        for name, task in (("loop", loop_task), ("parallel", par_task))[:: 1 if r % 2 else -1]:
            sync()
            start = time.perf_counter()
            updates = client_updates(task, params, users, r, rng)
            sync()
            timed[name] = (time.perf_counter() - start, updates)
        for a, b in zip(timed["loop"][1], timed["parallel"][1]):
            worst = max(worst, float((a.delta - b.delta).norm() / a.delta.norm().clamp_min(1e-30)))
        if worst > 1e-4:
            raise SystemExit(f"round {r}: a cohort-parallel delta differs from the loop's by {worst:.2e}")
        start = time.perf_counter()
        session.server.apply_round(r, cohort, ClientReplies(timed["parallel"][1]))
        session.ledger.record_round(r)
        elapsed = time.perf_counter() - start
        if r >= args.warmup:
            loop_s.append(timed["loop"][0])
            par_s.append(timed["parallel"][0])
            server_s.append(elapsed)
            rows.append(sum(len(par_task.units[u]) for u in users))
        print(f"{device} round {r}: loop {timed['loop'][0]:.2f} s, parallel {timed['parallel'][0]:.2f} s, "
              f"server {elapsed:.3f} s", flush=True)
    session.run.unlock()
    loop, par, server = (statistics.median(x) for x in (loop_s, par_s, server_s))
    return {"device": device, "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "clients_per_round": len(users), "median_rows_per_round": statistics.median(rows),
            "parameters": int(session.server.params.numel()),
            "loop_clients_s": loop, "parallel_clients_s": par, "server_s": server,
            "loop_round_s": loop + server, "parallel_round_s": par + server,
            "parallel_over_loop": par / loop, "max_relative_delta_error": worst, "rounds_timed": len(loop_s)}


if __name__ == "__main__":
    main()
