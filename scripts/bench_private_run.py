"""A private run against the same run without noise (σ = 0), per mechanism (issue 56).

Both runs are prepared in one process (``privacy.research_key=seed``: the same cohorts, data
order and client randomness) and their rounds alternate — private then σ = 0 in even rounds,
σ = 0 then private in odd ones — each round the runner's own round (:func:`fedpriv.runner.run_round`:
the clients, the aggregation, the noise, the ledger, the round's checkpoint and files). So the
machine's drift over minutes, which moved whole runs of one config by 15% here, hits both alike.
We report the medians of the rounds after ``--skip`` (and before the last, which evaluates the
final model), the median of the per-round ratios, the one-time cost of preparing each run
(calibration, strategy), and the checkpoint's size.

    python scripts/bench_private_run.py [--rounds 40] [--mechanisms gaussian,bandmf,blt]
        [--real-text DIR] [--json docs/bench/private_vs_nonprivate.json] [EXTRA OVERRIDES ...]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fedpriv.config.compose import compose_config  # noqa: E402
from fedpriv.release.run_outputs import RunOutputs  # noqa: E402
from fedpriv.release.rundir import write_json  # noqa: E402
from fedpriv.runner import prepare, run_round  # noqa: E402
from server.app import round_fn_for  # noqa: E402

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
KINDS = ("private", "sigma0")


def merged(*overrides: str) -> tuple[str, ...]:
    """The overrides with a later value of a key replacing an earlier one (Hydra refuses a key twice)."""
    out: dict[str, str] = {}
    for item in overrides:
        out[item.split("=", 1)[0]] = item
    return tuple(out.values())


def interleaved(config: tuple[str, ...], rounds: int, tmp: Path) -> dict:
    """Prepare the private and the σ = 0 run of ``config`` and run their rounds alternately."""
    sessions, outputs, fns, prepare_s = {}, {}, {}, {}
    for kind in KINDS:
        overrides = config + (NON_PRIVATE if kind == "sigma0" else ())
        started = time.perf_counter()
        sessions[kind] = prepare(compose_config(list(overrides), tmp / kind))
        prepare_s[kind] = time.perf_counter() - started
        fns[kind] = round_fn_for(sessions[kind])
        session = sessions[kind]
        outputs[kind] = RunOutputs(session.run, session.spec, session.randomness.secure, {})
        outputs[kind].start(session.cfg, session.history, session.diagnostics, session.ledger)
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    origin = time.perf_counter()
    try:
        for r in range(rounds):
            for kind in (KINDS if r % 2 == 0 else KINDS[::-1]):
                started = time.perf_counter()
                run_round(sessions[kind], fns[kind], outputs[kind], r, origin)
                times[kind].append(time.perf_counter() - started)
    finally:
        for kind in KINDS:
            outputs[kind].close_rounds()
            sessions[kind].run.unlock()
    sizes = {kind: (tmp / kind / "checkpoints" / "last.pt").stat().st_size for kind in KINDS}
    return {"round_s": times, "prepare_s": prepare_s, "checkpoint_bytes": sizes,
            "dimension": sessions["private"].server.params.numel(),
            "noise_multiplier": sessions["private"].server.mechanism.noise_multiplier}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--skip", type=int, default=4, help="rounds left out of the medians (warm-up)")
    parser.add_argument("--mechanisms", default="gaussian,bandmf,blt")
    parser.add_argument("--real-text", type=Path, help="the real-text corpus directory: its shape instead")
    parser.add_argument("--json", type=Path)
    parser.add_argument("extra", nargs="*", help="more overrides for every run")
    args = parser.parse_args(argv)
    results = {}
    for name in args.mechanisms.split(","):
        shape = real_text(args.real_text) if args.real_text else ()
        config = merged(*BASE, f"rounds={args.rounds}", *MECHANISMS[name], *shape, *args.extra)
        with tempfile.TemporaryDirectory() as tmp:
            out = interleaved(config, args.rounds, Path(tmp))
        steady = {kind: out["round_s"][kind][args.skip:-1] for kind in KINDS}
        ratios = [p / n for p, n in zip(*steady.values())]
        out.update({"config": list(config), "median_s": {k: statistics.median(v) for k, v in steady.items()},
                    "ratio_of_medians": statistics.median(steady["private"]) / statistics.median(steady["sigma0"]),
                    "median_ratio": statistics.median(ratios),
                    "total_ratio": sum(steady["private"]) / sum(steady["sigma0"])})
        results[name] = out
        print(f"{name}: private {out['median_s']['private']:.3f} s, σ = 0 {out['median_s']['sigma0']:.3f} s a round: "
              f"{out['ratio_of_medians']:.3f}x (median ratio {out['median_ratio']:.3f}, totals "
              f"{out['total_ratio']:.3f})", flush=True)
    print("| mechanism | d | σ | private s/round | σ = 0 s/round | ratio of medians | median of round ratios "
          "| ratio of totals | prepare s (private / σ = 0) | last.pt MB (private / σ = 0) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['dimension']:,} | {r['noise_multiplier']:.4g} | {r['median_s']['private']:.3f} | "
              f"{r['median_s']['sigma0']:.3f} | **{r['ratio_of_medians']:.3f}** | {r['median_ratio']:.3f} | "
              f"{r['total_ratio']:.3f} | {r['prepare_s']['private']:.1f} / {r['prepare_s']['sigma0']:.1f} | "
              f"{r['checkpoint_bytes']['private'] / 1e6:.2f} / {r['checkpoint_bytes']['sigma0'] / 1e6:.2f} |")
    if args.json:
        write_json(args.json, {"results": results, "threads": os.environ.get("OMP_NUM_THREADS"),
                               "rounds": args.rounds, "skip": args.skip, "machine": platform.machine(),
                               "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
