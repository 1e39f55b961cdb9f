"""Issue 43's validation: ``plan=auto`` against the fixed defaults and a non-private reference, at
equal compute (expected cohort × rounds), at ε ∈ {2, 4, 8}, on the real-text corpus and on the
synthetic default.

Each run is one ``python -m fedpriv.simulate`` subprocess into ``OUT/<name>/`` (resumable: a run
whose summary.json exists is skipped); ``--jobs 2`` runs two at a time with one torch thread each
(accuracy is what is compared here, not wall time).

    python scripts/planner_validation.py [--out outputs/planner_validation] [--jobs 2] [--only NAME ...]
    python scripts/planner_validation.py --table [--json docs/results/planner_validation.json]

Corpus B (real text, ``scripts/build_real_text_corpus.py``; 2,559 train users): the small LSTM of
the calibration runs (scripts/planner_calibration.py), U = 5,000 client updates (cohort 50 × 100
rounds, the calibration's compute). Corpus A: the synthetic default (10,000 users; the default
experiment's cohort 150 × 220 rounds, U = 33,000). "fixed" is every key at its default (clip 0.5,
server lr 1, momentum 0.9, cosine; Gaussian noise under Poisson sampling, the data's own count under
zero-out); "auto" adds ``plan=auto population=N`` with the same U; "nonprivate" is the fixed run
with σ = 0 (and ``tuned``: the best non-private step measured in the calibration, lr·C = 4).
Per run the table gives ε, σ, the final test accuracy and loss, the best test loss, and the
summary's ``degraded`` verdict. One seed: an indication at the scale this machine allows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment_runs import evaluations, run_all, summary  # noqa: E402
from planner_calibration import REAL_MODEL, REAL_TEXT  # noqa: E402

EPSILONS = (8, 4, 2)
REAL_USERS = 2559  # the corpus's train users (docs/REAL_TEXT.md): public by construction here
SYNTHETIC_USERS = 10_000  # the generator's default num_users


def runs(real_text: Path) -> dict[str, list[str]]:
    """name → overrides, in the order they run (corpus B first: its runs are short)."""
    real = ["data=stackoverflow", f"data.path={real_text}", *REAL_MODEL, "cohort_size=50", "rounds=100",
            "eval_every=10", "privacy.delta=1e-5"]
    out: dict[str, list[str]] = {
        "B_nonprivate": [*real, "privacy.noise_multiplier=0"],
        "B_nonprivate_tuned": [*real, "privacy.noise_multiplier=0", "privacy.clip_norm=1.0", "optimizer.lr=4"],
    }
    for eps in EPSILONS:
        out[f"B_auto_eps{eps}"] = [*real, f"privacy.target_epsilon={eps}", "plan=auto", f"population={REAL_USERS}"]
        out[f"B_fixed_eps{eps}"] = [*real, f"privacy.target_epsilon={eps}"]
    synthetic = ["privacy.delta=1e-5"]
    out["A_nonprivate"] = [*synthetic, "privacy.noise_multiplier=0"]
    for eps in EPSILONS:
        out[f"A_auto_eps{eps}"] = [*synthetic, f"privacy.target_epsilon={eps}", "plan=auto",
                                   f"population={SYNTHETIC_USERS}"]
    for eps in EPSILONS:
        out[f"A_fixed_eps{eps}"] = [*synthetic, f"privacy.target_epsilon={eps}"]
    return out


def row(name: str, path: Path, overrides: list[str]) -> dict | None:
    """The table row of a finished run (None while it has not finished)."""
    done = summary(path)
    if done is None:
        return None
    ledger = json.loads((path / "privacy.json").read_text())
    evals = evaluations(path)
    best = min(evals, key=lambda r: r["test_loss"])
    final = evals[-1]
    plan = done.get("plan") or {}
    return {
        "name": name,
        "overrides": overrides,
        "epsilon": ledger["epsilon"],
        "sigma": float(ledger["noise_multiplier"]),
        "mechanism": ledger["mechanism"],
        "cohort_size": plan.get("cohort_size"),
        "rounds": int(done["rounds"]),
        "server_lr": plan.get("server_lr"),
        "accumulated_noise": (plan.get("prediction") or {}).get("accumulated_noise"),
        "noise": done.get("noise"),
        "final_accuracy": final["test_accuracy"],
        "final_loss": final["test_loss"],
        "best_loss": best["test_loss"],
        "best_round": best["round"],
        "degraded": done.get("degraded"),
        "wall_s": done.get("wall_s"),
    }


def table(rows: list[dict]) -> str:
    """A markdown table of the rows."""
    head = ("| run | ε | mechanism | σ | cohort × rounds | server lr | planned a | final acc | final loss "
            "| best loss (round) | degraded |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        eps = "∞" if r["epsilon"] is None else f"{r['epsilon']:.2f}"
        shape = f"{r['cohort_size']} × {r['rounds']}" if r["cohort_size"] else f"default × {r['rounds']}"
        lr = "default" if r["server_lr"] is None else f"{r['server_lr']:.3f}"
        a = "" if r["accumulated_noise"] is None else f"{r['accumulated_noise']:.2f}"
        lines.append(f"| {r['name']} | {eps} | {r['mechanism']} | {r['sigma']:.3f} | {shape} | {lr} | {a} | "
                     f"{r['final_accuracy']:.4f} | {r['final_loss']:.3f} | {r['best_loss']:.3f} ({r['best_round']}) "
                     f"| {'yes' if r['degraded'] else 'no'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/planner_validation"))
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (more than one: one torch thread each)")
    parser.add_argument("--only", nargs="*", help="run only these names, in this order (default: all)")
    parser.add_argument("--real-text", type=Path, default=REAL_TEXT, help="corpus B's stackoverflow.sqlite")
    parser.add_argument("--table", action="store_true", help="print the table of the finished runs")
    parser.add_argument("--json", type=Path, help="write the rows of the finished runs here")
    args = parser.parse_args()
    todo = runs(args.real_text)
    unknown = sorted(set(args.only or ()) - set(todo))
    if unknown:
        print(f"error: unknown run names: {', '.join(unknown)} (known: {', '.join(todo)})", file=sys.stderr)
        raise SystemExit(2)
    if not (args.table or args.json):
        run_all(args.out, {k: todo[k] for k in args.only} if args.only else todo, jobs=args.jobs)
        return
    rows = [r for k, v in todo.items() if (r := row(k, args.out / k, v)) is not None]
    if args.table:
        print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
