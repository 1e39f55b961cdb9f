"""Issue 43's planner calibration: measure where the accumulated noise of a run hurts, on two corpora.

The planner's figure (docs/PLANNER.md) is the accumulated noise per coordinate that server momentum
feeds into the model over T rounds, in units of the clip bound's step:

    a = η · C · σ_eff · √T / (m̄ · (1 − β)),   σ_eff = σ · g,  g = 1 for independent Gaussian noise,

with η the configured (peak) server lr of the cosine schedule (under cosine decay η·√T equals
sqrt(8/3 · Σ_t η_t²), the memo's form for any schedule), C the clip bound, m̄ the expected cohort,
β the momentum. This script handles the Gaussian mechanism (g = 1) with the cosine schedule only
and refuses anything else. Each run is one
``python -m fedpriv.simulate`` subprocess into ``OUT/<name>/``, one at a time; a run whose
summary.json exists is skipped (resumable).

    python scripts/planner_calibration.py [--out outputs/planner_calibration] [--only NAME ...]
    python scripts/planner_calibration.py --table [--json docs/results/planner_calibration.json]

Corpus A: the synthetic generator at the sweep scale (2,000 users, cohort 50, 100 rounds). Corpus B:
the StackOverflow-schema real-text file (``--real-text PATH``) with a small LSTM. Per run the table
gives σ (privacy.json), a, the final test accuracy and loss, the best test loss and its round, and
``degraded``: the final test loss more than 5% above the best (summary.json's own verdict is kept
beside it as ``summary_degraded``). Single seed, small scans: an indication, not a fit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment_runs import check_names, final_and_best, markdown_table, report, results_parser, run_all, summary  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpriv.degradation import LOSS_RISE  # noqa: E402  (the end-of-run warning's rule)
from fedpriv.plan.noise_figure import accumulated_noise  # noqa: E402
from fedpriv.release.rundir import read_mapping  # noqa: E402

REAL_TEXT = Path("/work/data/real_text/stackoverflow.sqlite")
COMMON = ["cohort_size=50", "eval_every=10", "privacy.delta=1e-5", "mechanism=gaussian", "sampling=poisson",
          "privacy.clip_norm=1.0"]
SYNTHETIC = ["data.synthetic.num_users=2000", "rounds=100", *COMMON]
# Corpus B's model and rounds: a small LSTM so that a run takes a few minutes on one thread.
REAL_MODEL = ["model=lstm", "model.embed_dim=32", "model.hidden_size=64", "model.projection_dim=32",
              "data.max_users=null"]


def _lr(lr: float) -> str:
    return f"{lr:g}"


def runs(real_text: Path, real_rounds: int) -> dict[str, list[str]]:
    """name → overrides, in the order they run."""
    out: dict[str, list[str]] = {}
    for eps, lrs in ((8, (0.125, 0.25, 0.5, 1.0, 2.0, 4.0)), (2, (0.125, 0.25, 0.5, 1.0, 2.0))):
        for lr in lrs:
            out[f"A_eps{eps}_lr{_lr(lr)}"] = [*SYNTHETIC, f"privacy.target_epsilon={eps}", f"optimizer.lr={lr}"]
    for lr in (1.0, 2.0, 4.0):
        out[f"A_sigma0_lr{_lr(lr)}"] = [*SYNTHETIC, "privacy.noise_multiplier=0", f"optimizer.lr={lr}"]
    real = ["data=stackoverflow", f"data.path={real_text}", *REAL_MODEL, f"rounds={real_rounds}", *COMMON]
    for lr in (0.125, 0.25, 0.5, 1.0, 2.0):
        out[f"B_eps8_lr{_lr(lr)}"] = [*real, "privacy.target_epsilon=8", f"optimizer.lr={lr}"]
    for lr in (1.0, 4.0):
        out[f"B_sigma0_lr{_lr(lr)}"] = [*real, "privacy.noise_multiplier=0", f"optimizer.lr={lr}"]
    return out


def row(name: str, path: Path, overrides: list[str]) -> dict | None:
    """The table row of a finished run (None while it has not finished)."""
    done = summary(path)
    if done is None:
        return None
    config = read_mapping(path / "config.yaml")
    ledger = json.loads((path / "privacy.json").read_text())
    opt = config["optimizer"]
    if ledger["mechanism"] != "gaussian" or opt.get("schedule") != "cosine":
        raise SystemExit(f"error: {name}: a is defined here for the Gaussian mechanism with the cosine "
                         f"server schedule only (got {ledger['mechanism']}, {opt.get('schedule')})")
    sigma, step = float(ledger["noise_multiplier"]), float(opt["lr"]) * float(config["privacy"]["clip_norm"])
    cohort = float(ledger["sampling"]["expected_cohort"])
    final, best = final_and_best(path)
    return {
        "name": name,
        "overrides": overrides,
        "epsilon": ledger["epsilon"],
        "sigma": sigma,
        "lr": float(opt["lr"]),
        "clip_norm": float(config["privacy"]["clip_norm"]),
        "rounds": int(done["rounds"]),
        # g = 1 (independent Gaussian noise): σ_eff = σ; the step is lr·C
        "a": accumulated_noise(sigma, int(done["rounds"]), cohort, step, float(opt.get("momentum", 0.0))),
        "final_accuracy": final["test_accuracy"],
        "final_loss": final["test_loss"],
        "best_loss": best["test_loss"],
        "best_round": best["round"],
        "degraded": final["test_loss"] > (1.0 + LOSS_RISE) * best["test_loss"],
        "summary_degraded": done.get("degraded"),
        "wall_s": done.get("wall_s"),
    }


def table(rows: list[dict]) -> str:
    """A markdown table of the rows."""
    head = "| run | ε | σ | lr·C | a | final acc | final loss | best loss (round) | degraded | wall s |"
    lines = []
    for r in rows:
        eps = "∞" if r["epsilon"] is None else f"{r['epsilon']:.2f}"
        wall = "" if r["wall_s"] is None else f"{r['wall_s']:.0f}"
        lines.append(f"| {r['name']} | {eps} | {r['sigma']:.4f} | {r['lr'] * r['clip_norm']:g} | {r['a']:.3f} | "
                     f"{r['final_accuracy']:.4f} | {r['final_loss']:.4f} | {r['best_loss']:.4f} ({r['best_round']}) "
                     f"| {'yes' if r['degraded'] else 'no'} | {wall} |")
    return markdown_table(head, lines)


def main() -> None:
    parser = results_parser(__doc__.splitlines()[0], Path("outputs/planner_calibration"))
    parser.add_argument("--real-text", type=Path, default=REAL_TEXT, help="corpus B's stackoverflow.sqlite")
    parser.add_argument("--real-rounds", type=int, default=100, help="corpus B's rounds")
    args = parser.parse_args()
    todo = runs(args.real_text, args.real_rounds)
    check_names(args.only, todo)
    if not (args.table or args.json):
        run_all(args.out, {k: todo[k] for k in args.only} if args.only else todo)
        return
    report(args, todo, row, table)


if __name__ == "__main__":
    main()
