"""Issue 30's privacy–utility frontier: accuracy at ε ∈ {1, 2, 4, 8} (δ = 1e-5) on the synthetic
default (DP-FedAvg, LSTM, 220 rounds, cohort 150 of 10,000) for each mechanism with the samplers it
is accounted with, each with fixed clips 0.25, 0.5 and 1.0 and adaptive clipping (normalized step,
the default), the best of those measured per point (not every clipping is run at every point).

    python scripts/frontier.py [--out outputs/frontier] [--only NAME ...] [--jobs 2]   # run (resumable)
    python scripts/frontier.py --table [--plot docs/frontier.png] [--json docs/results/frontier.json]

Configurations: independent Gaussian with Poisson sampling and with balls-in-bins; the tree with
cyclic sampling; BandMF (16 bands) with cyclic-Poisson, balls-in-bins and b-min-sep; BLT with
cyclic and with balls-in-bins (balls-in-bins and b-min-sep: ``privacy.accountant=mc``; 66 bins =
10,000 // 150; b-min-sep's calibration takes minutes: its samples cost O(rounds·bands)). Runs go
one at a time into ``OUT/<config>-eps<E>-<clipping>/``; a finished run (its ``summary.json``) is
skipped, so the script resumes where it stopped. A run whose test loss is not finite or above a
uniform guess's (ln 3,004 ≈ 8.01: the model ends worse than knowing nothing) is marked diverged.
"Best clipping" is chosen on the test accuracy itself (one seed), a diverged run only where
nothing else was run: an optimistic pick, the same for every configuration.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment_runs import run_all, summary  # noqa: E402

MC = ["sampling=balls_in_bins", "privacy.accountant=mc"]
CONFIGS: dict[str, list[str]] = {
    "gaussian-poisson": ["mechanism=gaussian", "sampling=poisson"],
    "gaussian-bib": ["mechanism=gaussian", *MC],
    "tree-cyclic": ["mechanism=tree", "sampling=cyclic"],
    "bandmf-cyclic_poisson": ["mechanism=bandmf", "mechanism.bands=16", "sampling=cyclic_poisson"],
    "bandmf-bib": ["mechanism=bandmf", "mechanism.bands=16", *MC],
    "bandmf-bminsep": ["mechanism=bandmf", "mechanism.bands=16", "sampling=b_min_sep", "privacy.accountant=mc"],
    "blt-cyclic": ["mechanism=blt", "sampling=cyclic"],
    "blt-bib": ["mechanism=blt", *MC],
}
EPSILONS = (8, 4, 2, 1)
# run-name suffix → (table column, overrides)
CLIPPINGS: dict[str, tuple[str, list[str]]] = {
    "fixed0.25": ("fixed 0.25", ["privacy.clip_norm=0.25"]),
    "fixed": ("fixed 0.5", []),
    "fixed1": ("fixed 1.0", ["privacy.clip_norm=1.0"]),
    "adaptive": ("adaptive (normalized)", ["privacy.clipping=adaptive"]),
}
UNIFORM_LOSS = math.log(3000 + 4)  # test loss of a uniform guess over the synthetic default's 3,004 ids


def runs() -> dict[str, list[str]]:
    """name → overrides, in the order they run (ε = 8 first: the known regime)."""
    out = {}
    for eps in EPSILONS:
        for config, overrides in CONFIGS.items():
            for clipping, (_, extra) in CLIPPINGS.items():
                out[f"{config}-eps{eps}-{clipping}"] = [*overrides, f"privacy.target_epsilon={eps}", *extra]
    return out


def results(out: Path) -> list[dict]:
    rows = []
    for name in runs():
        s = summary(out / name)
        if s is None:
            continue
        config, eps, clipping = name.rsplit("-", 2)
        loss = s["final"]["loss"]
        rows.append({"config": config, "epsilon": int(eps[3:]), "clipping": clipping,
                     "accuracy": s["final"]["accuracy"], "loss": loss,
                     "noise_multiplier": s["privacy"]["noise_multiplier"],
                     "claimed_epsilon": s["privacy"]["epsilon"],
                     "diverged": not math.isfinite(loss) or loss > UNIFORM_LOSS})
    return rows


def best(rows: list[dict]) -> dict[tuple[str, int], dict]:
    out: dict[tuple[str, int], dict] = {}
    for r in rows:
        key = (r["config"], r["epsilon"])
        if key not in out or (not r["diverged"], r["accuracy"]) > (not out[key]["diverged"], out[key]["accuracy"]):
            out[key] = r
    return out


def table(rows: list[dict]) -> str:
    columns = ["configuration", "ε", *(label for label, _ in CLIPPINGS.values()), "σ", "best"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    by = {(r["config"], r["epsilon"], r["clipping"]): r for r in rows}
    top = best(rows)
    for eps in EPSILONS:
        for config in CONFIGS:
            cells = []
            for clipping in CLIPPINGS:
                r = by.get((config, eps, clipping))
                cells.append("—" if r is None else f"{r['accuracy']:.4f}" + (" (diverged)" if r["diverged"] else ""))
            r = top.get((config, eps))
            if r is None:
                continue
            lines.append(f"| {config} | {eps} | {' | '.join(cells)} | {r['noise_multiplier']:.3f} | "
                         f"{r['accuracy']:.4f} |")
    return "\n".join(lines)


def plot(rows: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    top = best(rows)
    for config in CONFIGS:
        points = sorted((eps, r["accuracy"]) for (c, eps), r in top.items() if c == config)
        if points:
            ax.plot(*zip(*points), "o--" if config.endswith("bib") else "o-", label=config, lw=1)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="user-level ε (δ = 1e-5)", ylabel="test accuracy (best clipping measured)",
           title="privacy–utility frontier, synthetic default (220 rounds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/frontier"))
    parser.add_argument("--only", nargs="*", help="run only these names, in this order (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (>1: one torch thread each)")
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    if not (args.table or args.plot or args.json):
        todo = runs()
        unknown = sorted(set(args.only or ()) - set(todo))
        if unknown:
            parser.error(f"unknown run names: {', '.join(unknown)}")
        run_all(args.out, {k: todo[k] for k in args.only} if args.only else todo, args.jobs)
        return
    rows = results(args.out)
    if args.table:
        print(table(rows))
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
