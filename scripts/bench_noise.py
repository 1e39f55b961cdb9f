"""Gaussian noise draw for a model's gradients: the secret ChaCha20 keystream (issue 26) against
the draw it replaced (torch ``randn`` in blocks of 2^20, each from a ``torch.Generator`` seeded
with a 63-bit seed, of which torch keeps 32 bits: not a secret; reproduced here only to compare).

    python scripts/bench_noise.py [--reps 31] [--threads 2] [--json docs/bench/noise_draw.json]

The tensors are the parameters of the two models of ``scripts/bench_clipping.py`` (transformer,
8.30M coordinates; StackOverflow-size LSTM, 4.05M), so the blocks are cut per tensor as in a
Book-Keeping step. Timing is interleaved in one process: each repetition draws every
(model, method) once, in an order rotated by one each repetition; we report medians and the
ratio new / previous per model.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_clipping import fedpriv_model  # noqa: E402
from fedpriv.clipping import GaussianKeystream  # noqa: E402
from fedpriv.keys.keystream import BLOCK, run_blocks  # noqa: E402
from fedpriv.release.rundir import write_json  # noqa: E402


def previous_draw(tensors: list[torch.Tensor], std: float, generator: torch.Generator) -> None:
    """The draw before issue 26 (fedpriv/clipping/noise.py at 9755661), kept for this comparison."""
    noises = [torch.empty(t.numel(), dtype=t.dtype) for t in tensors]
    blocks = [(k, start, min(start + BLOCK, n.numel())) for k, n in enumerate(noises)
              for start in range(0, n.numel(), BLOCK)]
    seeds = torch.randint(0, 2**63 - 1, (len(blocks),), generator=generator).tolist()

    def draw(j: int) -> None:
        k, start, stop = blocks[j]
        torch.randn(stop - start, generator=torch.Generator().manual_seed(seeds[j]), dtype=noises[k].dtype,
                    out=noises[k][start:stop])

    run_blocks(draw, len(blocks))
    for t, noise in zip(tensors, noises):
        t.view(-1).add_(noise, alpha=std)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=31)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    grads = {name: [torch.zeros_like(p) for p in fedpriv_model(name).parameters()] for name in ("transformer", "lstm")}
    generator = torch.Generator().manual_seed(0)
    stream = GaussianKeystream()
    methods = {"previous (seeded torch.Generator blocks)": lambda ts: previous_draw(ts, 1.0, generator),
               "keystream (ChaCha20 + Box-Muller)": lambda ts: stream.add_(ts, 1.0)}
    jobs = [(model, method) for model in grads for method in methods]
    times: dict[tuple[str, str], list[float]] = {job: [] for job in jobs}
    for rep in range(args.warmup + args.reps):
        shift = rep % len(jobs)
        for model, method in jobs[shift:] + jobs[:shift]:
            started = time.perf_counter()
            methods[method](grads[model])
            if rep >= args.warmup:
                times[(model, method)].append(time.perf_counter() - started)
    names = list(methods)
    result = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "threads": args.threads,
              "reps": args.reps, "machine": platform.processor() or platform.machine(), "models": {}}
    print(f"{'model':12s} {'coordinates':>12s} {'previous ms':>12s} {'keystream ms':>13s} {'ratio':>7s}")
    for model, tensors in grads.items():
        prev, new = (statistics.median(times[(model, m)]) * 1e3 for m in names)
        size = sum(t.numel() for t in tensors)
        result["models"][model] = {"coordinates": size, "previous_ms": prev, "keystream_ms": new, "ratio": new / prev,
                                   "previous_ms_all": [t * 1e3 for t in times[(model, names[0])]],
                                   "keystream_ms_all": [t * 1e3 for t in times[(model, names[1])]]}
        print(f"{model:12s} {size:12,d} {prev:12.2f} {new:13.2f} {new / prev:7.3f}")
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
