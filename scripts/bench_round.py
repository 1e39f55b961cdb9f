"""Round-overhead benchmark: one DP-FedAvg round of 100 clients on the StackOverflow-size LSTM.

Compares, in one process:
  * compute  — the summed time of the 100 client updates alone (local SGD, no transport);
  * local    — a full round on ``backend=local``: the clients stream into the round's sum
               (fedpriv.round.clients.in_process_round_fn; no message), then clipping, noise, server
               optimizer, EMA;
  * grid     — the same round through the in-process Flower grid (ClientApp, one message per
               node, encode/decode): what ``backend=local`` ran before it streamed its clients;
  * flower   — rounds on ``backend=flower`` (Flower's simulation engine, Ray, 2 workers).
Every round runs compute and one full round (local and grid alternate, each round the server's
state advances once), in alternating order; each full round is divided by its own round's compute
and the medians of those ratios are reported (this machine's speed drifts). flower runs afterwards
in the same process (Ray start-up excluded: its first round is dropped).

    python scripts/bench_round.py [--rounds 6] [--steps 1] [--json PATH]
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
    from fedpriv.config.compose import compose_config

    overrides = ["rounds=%d" % (args.rounds + 2), "cohort_size=100", "sampling=fixed", "progress=false",
                 "eval_every=1000", "privacy.noise_multiplier=1.0", "privacy.clip_norm=1.0",
                 "data.synthetic.num_users=1000", "data.synthetic.vocab_size=10000",
                 "data.synthetic.num_test=100", "data.synthetic.num_public=100",
                 "model.embed_dim=96", "model.hidden_size=670", "model.projection_dim=96",
                 "client.batch_size=16", "client.epochs=1",
                 f"client.max_steps={args.steps if args.steps else 'null'}", *extra]
    return compose_config(overrides, run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds (half local, half grid)")
    parser.add_argument("--steps", type=int, default=1, help="local steps per client (0: one full epoch)")
    parser.add_argument("--skip-flower", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch

    from client.app import make_client_app
    from fedpriv.keys.research_key import client_randomness
    from fedpriv.release.rundir import json_text, write_json
    from fedpriv.round.clients import client_update, in_process_round_fn
    from fedpriv.runner import prepare
    from server.app import grid_round_fn, run_flower_simulation
    from server.grid import LocalGrid

    torch.set_num_threads(2)
    tmp = Path(tempfile.mkdtemp(prefix="bench_round_"))
    session = prepare(compose(tmp / "local", args))
    task, server = session.task, session.server
    round_fns = {"local": in_process_round_fn(task, session.spec),
                  "grid": grid_round_fn(LocalGrid(make_client_app(session.cfg)), 1, None)}
    rng = client_randomness(session.cfg)
    times: dict[str, list[float]] = {"compute": [], "local": [], "grid": []}
    ratios: dict[str, list[float]] = {"local": [], "grid": []}
    for r in range(args.rounds + 2):  # rounds 0 and 1 warm up both paths
        cohort = server.cohort(r)
        system = ("local", "grid")[r % 2]
        spent = {}
        for kind in (("compute", system) if (r // 2) % 2 else (system, "compute")):
            if kind == "compute":
                total = 0.0
                for u in cohort:
                    t0 = time.perf_counter()
                    client_update(task, server.params, int(u), r, rng)
                    total += time.perf_counter() - t0
            else:
                t0 = time.perf_counter()
                server.apply_round(r, cohort, round_fns[kind](server.round_inputs(r, cohort)))
                total = time.perf_counter() - t0
            spent[kind] = total
        if r >= 2:
            for kind, total in spent.items():
                times[kind].append(total)
            ratios[system].append(spent[system] / spent["compute"])
    result = {k: statistics.median(v) for k, v in times.items()}
    result.update({f"{k}_ratio_to_compute": statistics.median(v) for k, v in ratios.items()})
    result["ratios"] = ratios
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
