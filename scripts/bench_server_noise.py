"""The server mechanisms' noise draw (issue 31, item 1): a StackOverflow-size round's 4.05M
normals from :class:`fedpriv.keys.randomness.NoiseStream` (ChaCha20 keystream, 64-bit radius words, on
every core) against the draw it replaced (SHAKE-256 on one core, Box–Muller of 53-bit uniforms in
float64; reproduced here only to compare) and Book-Keeping's narrow keystream (32-bit radius words).

    python scripts/bench_server_noise.py [--reps 21] [--threads 2] [--json docs/bench/server_noise_draw.json]

Timing is interleaved in one process: each repetition draws once by every method, in an order
rotated by one each repetition; we report medians and each method's ratio to the previous draw.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedpriv.clipping import GaussianKeystream  # noqa: E402
from fedpriv.keys.randomness import KEY_BYTES, NoiseStream, uniforms  # noqa: E402
from fedpriv.keys.research_key import key_from_seed  # noqa: E402
from fedpriv.release.rundir import write_json  # noqa: E402

COORDINATES = 4_050_748  # the StackOverflow LSTM of scripts/bench_round.py


def previous_draw(key: bytes, draw: int, n: int) -> torch.Tensor:
    """The mechanisms' draw before issue 31 (SHAKE-256 uniforms, float64 Box–Muller), kept to compare."""
    pairs = (n + 1) // 2
    u = torch.from_numpy(uniforms(key, "noise", (draw,), 2 * pairs)).view(2, pairs)
    radius = torch.sqrt(-2.0 * torch.log1p(-u[0]))
    angle = (2.0 * math.pi) * u[1]
    return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:n].to(torch.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    key = key_from_seed(0)
    stream, narrow = NoiseStream(key), GaussianKeystream(key[:KEY_BYTES])
    methods = {"previous (SHAKE-256, float64, one core)": lambda r: previous_draw(key, r, COORDINATES),
               "NoiseStream (ChaCha20, wide tail)": lambda r: stream.normal((COORDINATES,)),
               "GaussianKeystream (narrow, BK's)": lambda r: narrow.normal((COORDINATES,))}
    names = list(methods)
    times: dict[str, list[float]] = {m: [] for m in names}
    for rep in range(args.warmup + args.reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            methods[name](rep)
            if rep >= args.warmup:
                times[name].append(time.perf_counter() - started)
    medians = {m: statistics.median(times[m]) * 1e3 for m in names}
    print(f"{'draw of %d normals' % COORDINATES:42s} {'median ms':>10s} {'/ previous':>11s}")
    for m in names:
        print(f"{m:42s} {medians[m]:10.2f} {medians[m] / medians[names[0]]:11.3f}")
    if args.json:
        write_json(args.json, {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "threads": args.threads,
                               "reps": args.reps, "coordinates": COORDINATES,
                               "machine": platform.processor() or platform.machine(),
                               "median_ms": medians, "all_ms": {m: [t * 1e3 for t in times[m]] for m in names}})


if __name__ == "__main__":
    main()
