"""What a resume costs now that correlated noise is replayed instead of checkpointed (issue 56).

For each mechanism at a model size d: R rounds of live noise (timed per round), then a resume from
the R-round state (``load_state_dict``: the replay of every round since the last empty state,
checked against the checkpoint's digest), timed. The replay's cost per round times the rounds of
a run is the resume's cost (a StackOverflow run of 1,600 rounds at the 4.05M-parameter LSTM: see
docs/BENCHMARKS.md).

    python scripts/bench_noise_replay.py [--dimension 4050748] [--rounds 60] [--bands 16]
        [--json docs/bench/noise_replay.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedpriv.keys.randomness import NoiseStream  # noqa: E402
from fedpriv.keys.research_key import key_from_seed  # noqa: E402
from fedpriv.mechanisms.bandmf import BandMFMechanism  # noqa: E402
from fedpriv.mechanisms.blt import BLTMechanism  # noqa: E402
from fedpriv.mechanisms.gaussian import GaussianMechanism  # noqa: E402
from fedpriv.mechanisms.tree import TreeMechanism  # noqa: E402
from fedpriv.release.rundir import write_json  # noqa: E402


def build(name: str, rounds: int, bands: int):
    noise = NoiseStream(key_from_seed(0))
    if name == "gaussian":
        return GaussianMechanism(1.0, 1.0, noise=noise)
    if name == "bandmf":
        return BandMFMechanism(1.0, 1.0, rounds=rounds, bands=bands, noise=noise, kind="toeplitz", iterations=50)
    if name == "blt":
        return BLTMechanism(1.0, 1.0, rounds=rounds, buffers=4, iterations=50, noise=noise)
    return TreeMechanism(1.0, 1.0, noise=noise, estimator="efficient")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dimension", type=int, default=4_050_748)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--bands", type=int, default=16)
    parser.add_argument("--mechanisms", default="gaussian,bandmf,blt,tree")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    shape = (args.dimension,)
    results = {}
    for name in args.mechanisms.split(","):
        live = build(name, args.rounds, args.bands)
        live.noise(0, shape)  # strategy optimisation and first touch: not timed
        times = []
        for t in range(1, args.rounds):
            started = time.perf_counter()
            live.noise(t, shape)
            times.append(time.perf_counter() - started)
        state = live.state_dict()
        resumed = build(name, args.rounds, args.bands)
        resumed.adopt_strategy(state)  # as a resume does before calibration: not part of the replay
        resumed.matrix(1)  # the strategy's checks and derived tables, also done before (not timed)
        started = time.perf_counter()
        resumed.load_state_dict(state)
        replay = time.perf_counter() - started
        results[name] = {"live_round_s": statistics.median(times), "resume_s": replay,
                         "replayed_rounds": args.rounds if name != "gaussian" else 0,
                         "resume_s_per_round": replay / args.rounds}
        print(f"{name}: live {1000 * results[name]['live_round_s']:.1f} ms a round; resume after {args.rounds} "
              f"rounds {replay:.2f} s ({1000 * replay / args.rounds:.1f} ms a replayed round)", flush=True)
    if args.json:
        write_json(args.json, {"dimension": args.dimension, "rounds": args.rounds, "bands": args.bands,
                               "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
                               "machine": platform.machine(), "results": results, "date": time.strftime("%Y-%m-%d")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
