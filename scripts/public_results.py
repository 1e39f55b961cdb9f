"""Issue 5's results table: private accuracy with and without public data at a tight and a loose
budget, on the synthetic default (each run is a full default run, ≈ 6 min on 2 CPU cores).

    python scripts/public_results.py [--out outputs/public_results] [--only NAME ...] [--table]

``--only`` takes ``budget-variant`` names (e.g. ``tight-none very_tight-distill1``); without it
every combination runs (18 runs, ≈ 2 h).

Runs ``python -m fedpriv.simulate`` once per (budget, variant), sequentially, into
``OUT/<budget>-<variant>/``; a run whose ``summary.json`` exists is not repeated. Then prints the
Markdown table (``--table``: only print it) from the summaries — every number comes from them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment_runs import run_once, summary  # noqa: E402

BUDGETS = {"tight": (1.0, []), "loose": (8.0, []), "very_tight": (0.3, []),
           "tight_lr0.5": (1.0, ["optimizer.lr=0.5"])}  # name -> (target epsilon, extra overrides)
VARIANTS = {  # name -> (label, overrides)
    "none": ("no public data", []),
    "pretrain": ("pre-training on all public data", ["+experiment=public_pretrain"]),
    "distill1": ("1% + distillation", ["+experiment=distill"]),
    "distill": ("all public data + distillation", ["+experiment=distill", "public.pretrain_fraction=1.0"]),
    "mid": ("mid-training, distribution matching (ratio, top 5%)", ["+experiment=mid_training"]),
    "mid_private": ("mid-training, p_priv-only ablation (top 5%)",
                    ["+experiment=mid_training", "public.mid_training_score=private"]),
}


def run(out: Path, budget: str, variant: str) -> Path:
    epsilon, extra = BUDGETS[budget]
    return run_once(out / f"{budget}-{variant}", [*VARIANTS[variant][1], f"privacy.target_epsilon={epsilon}", *extra])


def public_used(summary: dict) -> str:
    """Distinct public sentences the student trained on (pre-training and/or mid-training)."""
    parts = []
    if "public" in summary:
        parts.append(f"{int(summary['public']['public_sentences_used']):,}")
    if "distribution_matching" in summary:
        parts.append(f"{int(summary['distribution_matching']['public_sentences_used']):,}")
    return " + ".join(parts) or "0"


def table(out: Path) -> str:
    lines = ["| budget | variant | public sentences used | DM precision (base rate) | final accuracy | test loss | ε |",
             "|---|---|---|---|---|---|---|"]
    for budget in BUDGETS:
        for variant, (label, _) in VARIANTS.items():
            s = summary(out / f"{budget}-{variant}")
            if s is None:
                continue
            dm = s.get("distribution_matching")
            prec = f"{dm['precision']:.3f} ({dm['base_rate']:.3f})" if dm and "precision" in dm else "—"
            lines.append(f"| {budget} | {label} | {public_used(s)} | {prec} | {s['final']['accuracy']:.4f} | "
                         f"{s['final']['loss']:.3f} | {s['privacy']['epsilon']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("outputs/public_results"))
    ap.add_argument("--only", nargs="*", default=None, help="budget-variant names, e.g. tight-none")
    ap.add_argument("--table", action="store_true", help="only print the table of finished runs")
    args = ap.parse_args()
    if not args.table:
        names = args.only or [f"{b}-{v}" for b in BUDGETS for v in VARIANTS]  # --only: in the order given
        for name in names:
            budget, _, variant = name.partition("-")
            if budget not in BUDGETS or variant not in VARIANTS:
                ap.error(f"unknown run {name!r} (budget-variant, e.g. tight-none)")
            run(args.out, budget, variant)
    print(table(args.out))


if __name__ == "__main__":
    main()
