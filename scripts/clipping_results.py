"""Issue 16's clipping table: the synthetic default (DP-FedAvg, LSTM, 220 rounds) with each noise
mechanism, the tuned fixed clip 0.5 and adaptive clipping (γ = 0.5, η_C = 0.2, σ_b = cohort/20,
C₀ = 0.5), at ε = 8 and ε = 2; plus adaptive clipping started from C₀ = 0.05 and C₀ = 5
(independent Gaussian noise, ε = 8), and adaptive clipping with the target quantile γ = 0.1
(every mechanism at ε = 2; the tree and independent noise at ε = 8). Those adaptive rows use
Andrew et al.'s server step (``privacy.adaptive.step=bound``: the step scales with C_t). Issue 30's
rows ``…-adaptive-norm…`` use the default ``step=normalized`` (the step scaled by S/C_t, S =
``privacy.clip_norm`` = 0.5; fedpriv/round/adaptive_clipping.py) at ε = 8 and 2 for every mechanism, and
from C₀ = 0.05 and 5 (``privacy.adaptive.initial_bound``) at ε = 8.

    python scripts/clipping_results.py [--out outputs/clipping] [--jobs 2] [--only NAME ...]
                                       [--table] [--plot PNG]

Each run is ``python -m fedpriv.simulate mechanism=M [sampling/bands] privacy.target_epsilon=E
[privacy.clipping=adaptive privacy.clip_norm=C0]`` into ``OUT/<name>/`` (finished runs are skipped).
``--jobs 2`` runs two at a time with one torch thread each (``OMP_NUM_THREADS=1``; wall times are
then not comparable with single runs). ``--table`` prints the Markdown table from the runs' own
files; ``--plot`` draws the clip bound and the privatized clipped fraction of every adaptive run
over the rounds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment_runs import run_all, summary  # noqa: E402  (also puts the checkout on sys.path)

from fedpriv.release.rundir import read_jsonl  # noqa: E402

MECHANISMS = {"gaussian": ["mechanism=gaussian"], "tree": ["mechanism=tree", "sampling=cyclic"],
              "bandmf": ["mechanism=bandmf", "mechanism.bands=16", "sampling=cyclic_poisson"],
              "blt": ["mechanism=blt", "sampling=cyclic"]}
EPSILONS = (8, 2)
COLORS = {"gaussian": "tab:blue", "tree": "tab:orange", "bandmf": "tab:green", "blt": "tab:red"}
STARTS = (0.05, 5.0)  # adaptive from these C₀ (gaussian, ε = 8)
# Andrew et al.'s step and count noise (m/20), the ones issue 16's rows ran with
BOUND_STEP = "privacy.adaptive.step=bound privacy.adaptive.count_noise=7.5"
LOW_QUANTILE = (("tree", 8, 0.1), ("gaussian", 8, 0.1), ("gaussian", 2, 0.1), ("tree", 2, 0.1), ("bandmf", 2, 0.1),
                ("blt", 2, 0.1))  # adaptive with a lower target quantile γ


def runs() -> dict[str, list[str]]:
    """name → overrides, in the order they run."""
    out: dict[str, list[str]] = {}
    for eps in EPSILONS:
        for mech, over in MECHANISMS.items():
            base = [*over, f"privacy.target_epsilon={eps}"]
            out[f"{mech}-eps{eps}-fixed"] = base
            out[f"{mech}-eps{eps}-adaptive"] = [*base, "privacy.clipping=adaptive", *BOUND_STEP.split()]
    for c0 in STARTS:
        out[f"gaussian-eps8-adaptive-c{c0:g}"] = [*MECHANISMS["gaussian"], "privacy.target_epsilon=8",
                                                  "privacy.clipping=adaptive", f"privacy.clip_norm={c0:g}",
                                                  *BOUND_STEP.split()]
    for mech, eps, quantile in LOW_QUANTILE:
        out[f"{mech}-eps{eps}-adaptive-q{quantile:g}"] = [*MECHANISMS[mech], f"privacy.target_epsilon={eps}",
                                                      "privacy.clipping=adaptive",
                                                      f"privacy.adaptive.target_quantile={quantile:g}",
                                                      *BOUND_STEP.split()]
    for eps in (2, 8):  # issue 30: the normalized step (the default)
        for mech, over in MECHANISMS.items():
            out[f"{mech}-eps{eps}-adaptive-norm"] = [*over, f"privacy.target_epsilon={eps}",
                                                     "privacy.clipping=adaptive"]
    for c0 in STARTS:
        out[f"gaussian-eps8-adaptive-normc{c0:g}"] = [*MECHANISMS["gaussian"], "privacy.target_epsilon=8",
                                                      "privacy.clipping=adaptive",
                                                      f"privacy.adaptive.initial_bound={c0:g}"]
    return out


def table(out: Path) -> str:
    lines = ["| mechanism | ε | clipping | σ | accuracy | test loss | final C | clipped (last 20 rounds, privatized) |",
             "|---|---|---|---|---|---|---|---|"]
    for name in runs():
        s = summary(out / name)
        if s is None:
            continue
        mech, eps, kind, *variant = name.split("-")
        rows = read_jsonl(out / name / "metrics.jsonl")
        adaptive = kind == "adaptive"
        normalized = bool(variant) and variant[0].startswith("norm")
        tag = variant[0].removeprefix("norm") if variant else ""
        start = tag[1:] if tag.startswith("c") else "0.5"
        quantile = tag[1:] if tag.startswith("q") else "0.5"
        step = "normalized step (S = 0.5)" if normalized else "step ∝ C_t"
        label = f"adaptive, {step}, C₀ = {start}, γ = {quantile}" if adaptive else "fixed 0.5"
        clipped = [r["privatized_clipped_fraction"] for r in rows[-20:]] if adaptive else []
        final_c = f"{s['final_clip_norm']:.3g}" if adaptive else "0.5"
        frac = f"{sum(clipped) / len(clipped):.2f}" if clipped else "—"
        lines.append(f"| {mech} | {eps[3:]} | {label} | {s['privacy']['noise_multiplier']:.3f} | "
                     f"{s['final']['accuracy']:.4f} | {s['final']['loss']:.3f} | {final_c} | {frac} |")
    return "\n".join(lines)


def plot(out: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_c, ax_f) = plt.subplots(1, 2, figsize=(11, 4))
    for name in runs():
        if "adaptive" not in name or summary(out / name) is None:
            continue
        rows = read_jsonl(out / name / "metrics.jsonl")
        rounds = [r["round"] for r in rows]
        style = ":" if "-q" in name else "--" if "eps2" in name else "-"
        color = COLORS[name.split("-")[0]] if "-c" not in name else ("black" if "c0.05" in name else "grey")
        ax_c.plot(rounds, [r["clip_norm"] for r in rows], style, color=color, label=name.replace("-adaptive", ""),
                  lw=1)
        frac = [r["privatized_clipped_fraction"] for r in rows]  # 10-round moving average, for reading
        smooth = [sum(frac[max(0, i - 9):i + 1]) / len(frac[max(0, i - 9):i + 1]) for i in range(len(frac))]
        ax_f.plot(rounds, smooth, style, color=color, lw=0.8)
    ax_c.set_yscale("log")
    ax_c.axhline(0.5, color="grey", lw=0.5)
    ax_c.set(xlabel="round", ylabel="clip bound C_t",
             title="adaptive clip bound (η = 0.2; solid ε 8, dashed ε 2, dotted γ 0.1)")
    ax_f.axhline(0.5, color="grey", lw=0.5)
    ax_f.set(xlabel="round", ylabel="privatized clipped fraction 1 − b̃_t",
             title="clipped fraction (released; 10-round mean)")
    ax_c.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/clipping"))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    todo = {k: v for k, v in runs().items() if not args.only or k in args.only}
    if not (args.table or args.plot):
        run_all(args.out, todo, args.jobs)
    if args.table:
        print(table(args.out))
    if args.plot:
        plot(args.out, args.plot)
        print(json.dumps({"plot": str(args.plot)}))


if __name__ == "__main__":
    main()
