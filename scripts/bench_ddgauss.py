"""What distributed DP costs a party, on the default experiment's model: encoding vs local training.

    python scripts/bench_ddgauss.py [--users 6] [--repeats 5] [--threads 2] [--json PATH]

One process, the default config (``mechanism=ddgauss``, its 0.5M-parameter LSTM padded to 2^19),
alternated per repeat, medians after the first repeat:

* ``local training``: one client's update (:func:`fedpriv.round.clients.client_update`: what every
  mechanism's client computes);
* ``round one update``: clip, pad, randomized Hadamard rotation, scale and conditional randomized
  rounding of that update (:meth:`fedpriv.mechanisms.ddgauss_codec.DDGaussCodec.rounded`, per user);
* ``noise share``: one party's discrete Gaussian share (:meth:`DDGaussCodec.noise_share`, per party);
* ``decode``: the server's decoding of the sum (per round).

Also the bytes of one party's message (``padded_dim × bits / 8``, packed) against a clear float32
update (``d × 4``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedpriv.round.clients import client_update  # noqa: E402
from fedpriv.config.compose import compose_config  # noqa: E402
from fedpriv.plan import build_plan  # noqa: E402
from fedpriv.keys.research_key import client_randomness  # noqa: E402
from fedpriv.schema import RunConfig  # noqa: E402
from fedpriv.config.resolve import run_config  # noqa: E402
from fedpriv.task import load_task  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = compose_config(["mechanism=ddgauss", "progress=false"], "/tmp/fedpriv-bench-ddgauss")
    spec: RunConfig = run_config(cfg)
    task = load_task(spec)
    mech = build_plan(spec, task).ledger.mechanism  # key-less, at the calibrated σ: all the codec needs
    codec = mech.codec()
    rng = client_randomness(spec)
    params = task.initial_params
    round_key, party_key = b"r" * 32, b"p" * 32
    users = list(range(args.users))
    times: dict[str, list[float]] = {"local training": [], "round one update": [], "noise share": [], "decode": []}
    for repeat in range(args.repeats):
        train, rounding = [], []
        updates = []
        for u in users:
            start = time.perf_counter()
            updates.append(client_update(task, params, u, repeat, rng))
            train.append(time.perf_counter() - start)
        summed = torch.zeros(codec.mechanism.dim, dtype=torch.int64)
        for update in updates:
            start = time.perf_counter()
            summed += codec.rounded(update.delta, round_key, repeat, party_key, update.user)
            rounding.append(time.perf_counter() - start)
        start = time.perf_counter()
        message = codec.message(summed, repeat, party_key, 0)
        share = time.perf_counter() - start
        start = time.perf_counter()
        codec.decode(message, round_key, repeat, params.numel())
        decode = time.perf_counter() - start
        if repeat:  # the first repeat warms up
            times["local training"].append(statistics.median(train))
            times["round one update"].append(statistics.median(rounding))
            times["noise share"].append(share)
            times["decode"].append(decode)
    medians = {k: statistics.median(v) for k, v in times.items()}
    dist = codec.mechanism
    out = {"date": date.today().isoformat(), "threads": args.threads, "parameters": params.numel(),
           "padded_dim": dist.dim, "bits": codec.bits, "shares": mech.shares,
           "seconds_median": medians,
           "rounding_over_training": medians["round one update"] / medians["local training"],
           "message_bytes_packed": dist.dim * codec.bits // 8, "clear_update_bytes": params.numel() * 4,
           "granularity": dist.granularity, "share_std": dist.local_std}
    print(json.dumps(out, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
