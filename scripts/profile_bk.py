"""Where a Book-Keeping step's time goes, against the non-private step (torch.profiler).

    python scripts/profile_bk.py --model transformer [--steps 6] [--json PATH]
    python scripts/profile_bk.py --model lstm

The same model, batch and step as ``scripts/bench_clipping.py`` (its helpers build them): the
non-private step (``nn.LSTM`` for the LSTM) and BK mixopt, each profiled for ``--steps`` steps
after warm-up, alternating. Phases are the profiler scopes the engine opens
(``bk.hooks.<layer>``, ``bk.audit``, ``bk.output_gradients`` (the ghost backward: output
gradients only), ``bk.contributions.<layer>``, ``bk.norms.<layer>`` (ghost or instantiated
per-sample norms), ``bk.clipped_sum.<layer>`` (the book-kept weighted sum), ``bk.noise``,
``bk.forward_replay`` (on an engine's first 4 steps and every 8th after)) and
this script's own (``step.forward``: forward and loss, ``step.backward``, ``step.update``).
Reported per step: wall time of each scope (inclusive; nested bk scopes are inside
``step.*``), and the heaviest aten ops of each mode. Profiling adds overhead: use the ratios of
``scripts/bench_clipping.py`` for the headline, this for where the difference lies.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_clipping as bench  # noqa: E402
from fedpriv.clipping import BookKeeping  # noqa: E402
from fedpriv.release.rundir import write_json  # noqa: E402


def make_pair(name: str):
    """(non-private step, BK mixopt step), each a zero-argument function with scoped phases."""
    x, y = bench.make_batch(name)
    batch = x.shape[0]
    reference = bench.fedpriv_model(name)
    plain_model = (bench.copy_weights(reference, bench.RecurrentLM(nn.LSTM(96, 670, batch_first=True)))
                   if name == "lstm" else bench.fedpriv_model(name))
    bk_model = bench.fedpriv_model(name)
    bk = BookKeeping(bk_model, clip_norm=bench.CLIP, noise_multiplier=bench.SIGMA, mode="mixopt")

    def plain():
        with record_function("step.forward"):
            loss = bench.per_sample_loss(plain_model(x), y).sum()
        with record_function("step.backward"):
            loss.backward()
        with record_function("step.update"):
            bench.sgd([p for p in plain_model.parameters() if p.requires_grad], batch)

    def private():
        with record_function("step.forward"):
            losses = bench.per_sample_loss(bk_model(x), y)
        with record_function("step.backward"):
            bk.backward(losses)
        with record_function("step.update"):
            bench.sgd([p for p in bk_model.parameters() if p.requires_grad], batch)
    return plain, private


def profile_steps(step, steps: int):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    scopes: dict[str, float] = defaultdict(float)
    ops = []
    for event in prof.key_averages():
        if event.key.startswith(("step.", "bk.")):
            scopes[event.key] += event.cpu_time_total / 1e3 / steps  # ms per step (wall of the scope)
        elif event.key.startswith("aten::"):
            ops.append((event.key, event.self_cpu_time_total / 1e3 / steps, event.count // steps))
    ops.sort(key=lambda o: -o[1])
    return dict(scopes), ops


def group(scopes: dict[str, float]) -> dict[str, float]:
    """bk.<phase>.<layer> summed per phase, plus per-layer rows."""
    out: dict[str, float] = defaultdict(float)
    for key, ms in scopes.items():
        parts = key.split(".")
        out[".".join(parts[:2])] += ms
        if len(parts) > 2:
            out[key] += ms
    return dict(sorted(out.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(bench.CONFIGS), required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=12, help="aten ops listed per mode")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    plain, private = make_pair(args.model)
    for _ in range(3):
        plain()
        private()
    walls = {"non-private": [], "BK mixopt": []}
    for _ in range(6):  # unprofiled, interleaved: the reference for the profiled numbers
        for mode, step in (("non-private", plain), ("BK mixopt", private)):
            start = time.perf_counter()
            step()
            walls[mode].append(time.perf_counter() - start)
    results = {}
    for mode, step in (("non-private", plain), ("BK mixopt", private)):
        scopes, ops = profile_steps(step, args.steps)
        results[mode] = {"wall_ms": 1e3 * statistics.median(walls[mode]), "scopes_ms": group(scopes),
                         "top_ops": [{"op": k, "self_ms": ms, "calls": n} for k, ms, n in ops[:args.top]]}
    print(f"{args.model}: unprofiled medians non-private {results['non-private']['wall_ms']:.1f} ms, "
          f"BK mixopt {results['BK mixopt']['wall_ms']:.1f} ms "
          f"(ratio {results['BK mixopt']['wall_ms'] / results['non-private']['wall_ms']:.2f}); "
          f"profiled, per step (ms):")
    for mode, res in results.items():
        print(f"\n{mode}")
        for key, ms in res["scopes_ms"].items():
            indent = "    " if key.count(".") > 1 else "  "
            print(f"{indent}{key:34s} {ms:8.1f}")
        print("  heaviest aten ops (self ms per step, calls per step):")
        for op in res["top_ops"]:
            print(f"    {op['op']:40s} {op['self_ms']:8.1f} {op['calls']:6d}")
    if args.json:
        write_json(args.json, {"model": args.model, "steps": args.steps, "threads": args.threads,
                               "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "results": results})


if __name__ == "__main__":
    main()
