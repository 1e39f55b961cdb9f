"""Round-overhead benchmark: one DP-FedAvg round of 100 clients on the StackOverflow-size LSTM.

Compares, in one process:
  * compute  — the summed time of the 100 client updates alone (local SGD, no transport);
  * local    — a full round through the in-process Flower grid (ClientApp, message
               encode/decode, clipping, noise, server optimizer): what ``backend=local`` ran until
               it streamed its clients into the sum (fedpriv.clients.in_process_round_fn, not
               timed here yet);
  * flower   — rounds on ``backend=flower`` (Flower's simulation engine, Ray, 2 workers).
compute and local are interleaved round by round (this machine's speed drifts); flower runs
afterwards in the same process (Ray start-up excluded: its first round is dropped).

    python scripts/bench_round.py [--rounds 5] [--steps 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def compose(run_dir: Path, args: argparse.Namespace, *extra: str) -> dict:
    from fedpriv.compose import compose_config

    overrides = ["rounds=%d" % (args.rounds + 1), "cohort_size=100", "sampling=fixed", "progress=false",
                 "eval_every=1000", "privacy.noise_multiplier=1.0", "privacy.clip_norm=1.0",
                 "data.synthetic.num_users=1000", "data.synthetic.vocab_size=10000",
                 "data.synthetic.num_test=100", "data.synthetic.num_public=100",
                 "model.embed_dim=96", "model.hidden_size=670", "model.projection_dim=96",
                 "client.batch_size=16", "client.epochs=1",
                 f"client.max_steps={args.steps if args.steps else 'null'}", *extra]
    return compose_config(overrides, run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per system")
    parser.add_argument("--steps", type=int, default=1, help="local steps per client (0: one full epoch)")
    parser.add_argument("--skip-flower", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch

    from client.app import make_client_app
    from fedpriv.randomness import ClientRandomness
    from fedpriv.rundir import json_text, write_json
    from fedpriv.clients import client_update
    from fedpriv.runner import prepare
    from server.app import grid_round_fn, run_flower_simulation
    from server.grid import LocalGrid

    torch.set_num_threads(2)
    tmp = Path(tempfile.mkdtemp(prefix="bench_round_"))
    session = prepare(compose(tmp / "local", args))
    task, server = session.task, session.server
    round_fn = grid_round_fn(LocalGrid(make_client_app(session.cfg)), 1, None)
    rng = ClientRandomness.for_config(session.cfg)
    times: dict[str, list[float]] = {"compute": [], "local": []}
    for r in range(args.rounds + 1):  # round 0 warms up both paths
        cohort = server.cohort(r)
        for kind in (("compute", "local") if r % 2 else ("local", "compute")):
            if kind == "compute":
                total = 0.0
                for u in cohort:
                    t0 = time.perf_counter()
                    client_update(task, server.params, int(u), r, rng)
                    total += time.perf_counter() - t0
            else:
                t0 = time.perf_counter()
                server.apply_round(r, cohort, round_fn(server.round_inputs(r, cohort)))
                total = time.perf_counter() - t0
            if r:
                times[kind].append(total)
    result = {k: statistics.median(v) for k, v in times.items()}
    result["local_overhead"] = result["local"] / result["compute"] - 1
    if not args.skip_flower:
        fl = prepare(compose(tmp / "flower", args, "backend=flower"))
        run_flower_simulation(fl)
        walls = [row["wall_s"] for row in fl.diagnostics]  # research-mode diagnostics hold the timing
        per_round = [b - a for a, b in zip(walls, walls[1:])]  # drops round 1 (Ray start-up)
        result["flower"] = statistics.median(per_round)
        result["flower_first_round"] = walls[0]
        result["flower_ratio_to_compute"] = result["flower"] / result["compute"]
    result.update({"rounds": args.rounds, "clients_per_round": 100, "local_steps": args.steps,
                   "params": int(task.initial_params.numel()), "torch_threads": torch.get_num_threads()})
    print(json_text(result, indent=2))
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
