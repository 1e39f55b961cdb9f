"""DP-FedSGD round: one batched Book-Keeping pass vs the per-client loop, in users per second.

    python scripts/bench_fedsgd.py [--rounds 5] [--cohort 100] [--system-malloc] [--json PATH] [overrides ...]

Both compute the same clipped sum Σ_u min(1, C/‖Δ_u‖) Δ_u of one-step deltas (checked every
round) for the cohorts of rounds 0..R-1 of the default experiment (synthetic data, LSTM) with
``algorithm=dp_fedsgd``. Timing alternates the two per round (this machine drifts); medians.
Extra Hydra overrides (e.g. ``model=transformer``) are passed to the config.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fedpriv.round.aggregation import clip_factor  # noqa: E402
from fedpriv.allocator import retain_freed_memory  # noqa: E402
from fedpriv.round.cohort import CohortClipper  # noqa: E402
from fedpriv.config.compose import compose_config  # noqa: E402
from fedpriv.keys.research_key import clients_from_seed, key_from_seed  # noqa: E402
from fedpriv.release.rundir import write_json  # noqa: E402
from fedpriv.round.clients import client_update  # noqa: E402
from fedpriv.sampling import make_sampler  # noqa: E402
from fedpriv.config.resolve import run_config  # noqa: E402
from fedpriv.task import load_task  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cohort", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--user-rows", type=int, default=None,
                        help="keep only each user's first K sentences (small-data users, e.g. keyboards)")
    parser.add_argument("--system-malloc", action="store_true",
                        help="leave glibc's malloc as it is (runs tune it: fedpriv.allocator)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    retained = False if args.system_malloc else retain_freed_memory()
    cfg = compose_config(["algorithm=dp_fedsgd", *args.overrides])
    task = load_task(run_config(cfg))
    if args.user_rows:
        task.units = [rows[: args.user_rows] for rows in task.units]
    clip = float(cfg["privacy"]["clip_norm"])
    sampler = make_sampler("fixed", len(task.units), args.cohort, key_from_seed(0))
    def make_clipper() -> CohortClipper:
        return CohortClipper(copy.deepcopy(task.client_model), clip, task.local.lr, task.data.vocab.pad_id,
                             mode=cfg["algorithm"]["clipping_mode"], max_rows=int(cfg["algorithm"]["max_rows"]))

    clipper, full_layout = make_clipper(), make_clipper()
    full_layout.flat = False  # the output layer on every position of [B, T] (before issue 18)
    params = task.initial_params
    rng = clients_from_seed(0)
    one_pass, one_pass_full, loop, rows = [], [], [], []
    for r in range(args.rounds + 1):  # round 0 is warm-up
        cohort = sampler.sample(r)
        start = time.perf_counter()
        full = full_layout.clipped_sum(params, cohort, lambda u: task.units[u])
        t_full = time.perf_counter() - start
        start = time.perf_counter()
        fused = clipper.clipped_sum(params, cohort, lambda u: task.units[u])
        t_one = time.perf_counter() - start
        start = time.perf_counter()
        total = torch.zeros_like(params)
        for u in cohort:
            delta = client_update(task, params, int(u), r, rng).delta
            total.add_(delta, alpha=clip_factor(delta, clip)[0])
        t_loop = time.perf_counter() - start
        for name, got in (("one-pass", fused), ("one-pass (full layout)", full)):
            err = float(torch.linalg.vector_norm(got.total - total) / torch.linalg.vector_norm(total))
            if err > 1e-4:
                raise SystemExit(f"round {r}: the {name} sum differs from the loop by {err:.2e} (relative)")
        if r:
            one_pass.append(t_one)
            one_pass_full.append(t_full)
            loop.append(t_loop)
            rows.append(sum(len(task.units[int(u)]) for u in cohort))
    med_one, med_loop, med_full = statistics.median(one_pass), statistics.median(loop), statistics.median(one_pass_full)
    result = {"model": cfg["model"]["name"], "cohort": args.cohort, "rounds": args.rounds,
              "user_rows": args.user_rows,
              "median_rows_per_cohort": statistics.median(rows), "one_pass_s": med_one, "loop_s": med_loop,
              "one_pass_users_per_s": args.cohort / med_one, "loop_users_per_s": args.cohort / med_loop,
              "speedup": med_loop / med_one, "mode": cfg["algorithm"]["clipping_mode"],
              "flat_output_layer": clipper.flat, "one_pass_full_layout_s": med_full,
              "full_layout_speedup": med_loop / med_full, "retained_freed_memory": retained}
    print(f"{result['model']}, cohort {args.cohort} (median {result['median_rows_per_cohort']:.0f} rows), "
          f"{args.rounds} rounds, {args.threads} threads, "
          f"{'freed memory retained (fedpriv.allocator)' if retained else 'system malloc'}")
    print(f"one-pass BK ({result['mode']}): {med_one:.3f} s/round = {result['one_pass_users_per_s']:.0f} users/s")
    print(f"one-pass, head on [B, T]: {med_full:.3f} s/round = {args.cohort / med_full:.0f} users/s")
    print(f"per-client loop:          {med_loop:.3f} s/round = {result['loop_users_per_s']:.0f} users/s")
    print(f"speed-up {result['speedup']:.2f}x (sums agree to 1e-4 relative every round)")
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
