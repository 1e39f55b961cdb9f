"""A private run against the same run without noise (σ = 0), per mechanism (issue 56).

Each run is ``python -m fedpriv.simulate BASE MECHANISM [σ = 0]`` in its own process, one at a
time (never two trainings at once), private and non-private alternated (P N, N P, ...), with
``privacy.research_key=seed`` so both see the same cohorts and data order. A round's time is the
difference of consecutive ``wall_s`` in ``diagnostics.jsonl`` (everything between two rounds: the
clients, the aggregation, the noise, the ledger and the round's checkpoint and files); we report
the median over rounds after the first ``--skip`` (and before the last, which evaluates the final
model) and the process's whole wall time, and the
private / σ = 0 ratios of both.

    python scripts/bench_private_run.py [--pairs 2] [--rounds 40] [--mechanisms gaussian,bandmf,blt]
        [--json docs/bench/private_vs_nonprivate.json] [-- EXTRA OVERRIDES]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fedpriv.release.rundir import write_json  # noqa: E402

# The synthetic default at the shape: a 0.73M-parameter LSTM, cohorts of 91, 40 rounds.
BASE = ("model.hidden_size=256", "cohort_size=91", "eval_every=1000", "privacy.research_key=seed",
        "progress=false", "diagnostics=true")
MECHANISMS = {
    "gaussian": ("mechanism=gaussian",),
    "bandmf": ("mechanism=bandmf", "sampling=cyclic_poisson"),
    "blt": ("mechanism=blt", "sampling=cyclic"),
    "tree": ("mechanism=tree", "sampling=cyclic", "optimizer=ftrl"),
}
# The planner's real-text validation shape (docs/RESULTS.md): a 1.35M-parameter LSTM on the
# real-text corpus (scripts/build_real_text_corpus.py), 2,559 users, cohorts of 91, BandMF under
# cyclic Poisson sampling with 2559 // 91 = 28 groups (bands), momentum and an EMA, ε = 8.
def real_text(corpus: Path) -> tuple[str, ...]:
    return ("data=files", f"data.path={corpus / 'users.jsonl'}",
            f"data.vocab_path={corpus / 'stackoverflow.word_count'}",
            "data.user_column=user", "data.text_column=text", "data.split_column=split",
            "data.vocab_size=10000", "data.max_sentences_per_user=256", "model.embed_dim=64", "model.hidden_size=128",
            "model.projection_dim=64", "population=2559", "ema_decay=0.95", "client.max_steps=2",
            "client.batch_size=16", "privacy.clip_norm=1.0", "optimizer=momentum", "optimizer.lr=0.875",
            "optimizer.schedule=cosine", "mechanism.bands=28")


NON_PRIVATE = ("privacy.target_epsilon=null", "privacy.noise_multiplier=0")


def merged(*overrides: str) -> tuple[str, ...]:
    """The overrides with a later value of a key replacing an earlier one (Hydra refuses a key twice)."""
    out: dict[str, str] = {}
    for item in overrides:
        out[item.split("=", 1)[0]] = item
    return tuple(out.values())


def one_run(overrides: tuple[str, ...], skip: int) -> dict:
    """Run once; the median round time after ``skip`` rounds, the rounds' times and the wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
        started = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "fedpriv.simulate", *overrides, f"run_dir={run_dir}"],
                             cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if res.returncode != 0:
            raise SystemExit(f"error: run failed ({' '.join(overrides)}): {res.stderr.strip()[-500:]}")
        rows = [json.loads(line) for line in (run_dir / "diagnostics.jsonl").read_text().splitlines()]
        checkpoint = (run_dir / "checkpoints" / "last.pt").stat().st_size
    walls = [float(r["wall_s"]) for r in rows]
    rounds = [b - a for a, b in zip(walls, walls[1:])]
    if skip == 0:
        return {}
    # the last round also evaluates the final model: left out with the warm-up
    return {"round_s": statistics.median(rounds[skip:-1]), "rounds_s": rounds, "wall_s": wall,
            "train_s": walls[-1], "checkpoint_bytes": checkpoint}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--skip", type=int, default=4, help="rounds left out of the median (warm-up)")
    parser.add_argument("--mechanisms", default="gaussian,bandmf,blt")
    parser.add_argument("--real-text", type=Path, help="the real-text corpus directory: its shape instead")
    parser.add_argument("--json", type=Path)
    parser.add_argument("extra", nargs="*", help="more overrides for every run")
    args = parser.parse_args(argv)
    results = {}
    for name in args.mechanisms.split(","):
        shape = real_text(args.real_text) if args.real_text else ()
        config = merged(*BASE, f"rounds={args.rounds}", *MECHANISMS[name], *shape, *args.extra)
        runs = {"private": [], "sigma0": []}
        # warm-up, not timed: the strategy (BandMF, BLT) is optimised once and cached on disk (a
        # sweep's later runs read it), so neither timed run pays for it; a tiny model, same rounds
        one_run(merged(*config, "model.hidden_size=8", "eval_every=1000"), 0)
        for pair in range(args.pairs):
            order = ("private", "sigma0") if pair % 2 == 0 else ("sigma0", "private")
            for kind in order:
                runs[kind].append(one_run(config + (NON_PRIVATE if kind == "sigma0" else ()), args.skip))
                print(f"{name} {kind}: round {runs[kind][-1]['round_s']:.3f} s, run {runs[kind][-1]['wall_s']:.1f} s",
                      flush=True)
        round_ratio = [p["round_s"] / n["round_s"] for p, n in zip(runs["private"], runs["sigma0"])]
        wall_ratio = [p["wall_s"] / n["wall_s"] for p, n in zip(runs["private"], runs["sigma0"])]
        results[name] = {"config": list(config), "runs": runs, "round_ratio": round_ratio, "wall_ratio": wall_ratio,
                         "round_ratio_median": statistics.median(round_ratio),
                         "wall_ratio_median": statistics.median(wall_ratio)}
    print("| mechanism | private s/round | σ = 0 s/round | ratio (pairs) | private run s | σ = 0 run s | ratio "
          "| last.pt MB (private / σ = 0) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        p, n = r["runs"]["private"], r["runs"]["sigma0"]
        med = statistics.median
        print(f"| {name} | {med(x['round_s'] for x in p):.3f} | {med(x['round_s'] for x in n):.3f} | "
              f"**{r['round_ratio_median']:.3f}** ({', '.join(f'{x:.3f}' for x in r['round_ratio'])}) | "
              f"{med(x['wall_s'] for x in p):.1f} | {med(x['wall_s'] for x in n):.1f} | "
              f"{r['wall_ratio_median']:.3f} | {p[0]['checkpoint_bytes'] / 1e6:.2f} / "
              f"{n[0]['checkpoint_bytes'] / 1e6:.2f} |")
    if args.json:
        write_json(args.json, {"results": results, "threads": os.environ.get("OMP_NUM_THREADS"),
                               "machine": platform.machine(), "python": platform.python_version(),
                               "date": time.strftime("%Y-%m-%d")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
