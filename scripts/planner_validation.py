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
rounds, the calibration's compute; ``B15_*``: U = 15,000, cohort 100 × 150 rounds, the shape of the
issue's example, at ε = 8). Corpus A: the synthetic default (10,000 users; the default
experiment's cohort 150 × 220 rounds, U = 33,000). "fixed" is every key at its default (clip 0.5,
server lr 1, momentum 0.9, cosine; Gaussian noise under Poisson sampling, the data's own count under
zero-out); "auto" adds ``plan=auto population=N`` with the same U; "nonprivate" is the fixed run
with σ = 0 (and ``tuned``: the best non-private step measured in the calibration, lr·C = 4).
``--sensitivity`` (after the auto runs have finished) reruns a planned run with its server step
scaled so that the accumulated noise a is 0.35, 0.7 or 1.0 instead of the planner's target: the
rule's constant checked at the validation point (a fixed run with the plan's overrides); and the
ε = 2 synthetic plan at cohort 86 (``A_auto_eps2_m86``: where P peaks; the plan the present tie
rule picks, as a fixed run — the first rule picked 38 × 868, which ``A_auto_eps2`` ran under it).
Per run the table gives ε, σ, the final test accuracy and loss, the best test loss, and the
summary's ``degraded`` verdict. One seed: an indication at the scale this machine allows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment_runs import check_names, final_and_best, markdown_table, report, results_parser, run_all, summary  # noqa: E402
from planner_calibration import REAL_MODEL, REAL_TEXT  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpriv.data.synthetic import SyntheticConfig  # noqa: E402
from fedpriv.release.rundir import read_mapping  # noqa: E402
from fedpriv.schema import RunConfig  # noqa: E402

EPSILONS = (8, 4, 2)
REAL_USERS = 2559  # the corpus's train users (docs/REAL_TEXT.md): public by construction here
SYNTHETIC_USERS = SyntheticConfig.num_users  # the generator's default population


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
    # the shape (cohort 100 x 150 rounds): three times the compute, at eps 8 only
    real15 = [o.replace("cohort_size=50", "cohort_size=100").replace("rounds=100", "rounds=150") for o in real]
    out["B15_nonprivate"] = [*real15, "privacy.noise_multiplier=0"]
    out["B15_nonprivate_tuned"] = [*real15, "privacy.noise_multiplier=0", "privacy.clip_norm=1.0", "optimizer.lr=4"]
    out["B15_auto_eps8"] = [*real15, "privacy.target_epsilon=8", "plan=auto", f"population={REAL_USERS}"]
    out["B15_fixed_eps8"] = [*real15, "privacy.target_epsilon=8"]
    synthetic = ["privacy.delta=1e-5"]
    out["A_nonprivate"] = [*synthetic, "privacy.noise_multiplier=0"]
    for eps in EPSILONS:
        out[f"A_auto_eps{eps}"] = [*synthetic, f"privacy.target_epsilon={eps}", "plan=auto",
                                   f"population={SYNTHETIC_USERS}"]
    for eps in EPSILONS:
        out[f"A_fixed_eps{eps}"] = [*synthetic, f"privacy.target_epsilon={eps}"]
    return out


# planned run → a cohort of the planner's grid to run at the same ε and U as a fixed run (the rule at
# that cohort: rounds U // m, σ calibrated, the step at A_TARGET): where the progress P is flat across
# cohorts the tie-break picks the cohort, and this compares two of them
OTHER_COHORT = {"A_auto_eps2": 86}
SENSITIVITY = {"B_auto_eps8": (0.35, 0.7, 1.0), "A_auto_eps2": (0.35, 0.7)}  # planned run → a values


def _as_fixed(base: list[str], planned: list[str]) -> list[str]:
    """``base`` without plan=auto and without the keys ``planned`` sets, then ``planned``: the CLI
    refuses a key given twice."""
    keys = {o.partition("=")[0] for o in planned} | {"plan"}
    return [o for o in base if o.partition("=")[0] not in keys] + planned


def sensitivity_runs(out: Path, todo: dict[str, list[str]]) -> dict[str, list[str]]:
    """``<planned>_a<value>`` → the planned run's config as a fixed run (plan=auto's overrides) with
    its server lr scaled by value / planned a; only for planned runs that have finished."""
    from fedpriv.plan.auto import overrides  # noqa: PLC0415 (lazy: only the runs that are built need it)

    runs_: dict[str, list[str]] = {}
    for name, values in SENSITIVITY.items():
        done = summary(out / name)
        if done is None:
            continue
        plan = done["plan"]
        for value in values:
            lr = plan["server_lr"] * value / plan["prediction"]["accumulated_noise"]
            runs_[f"{name}_a{value:g}"] = _as_fixed(todo[name], overrides(dict(plan, server_lr=lr)))
    return runs_


def other_cohort_runs(todo: dict[str, list[str]]) -> dict[str, list[str]]:
    """``<planned>_m<cohort>``: the planned run's config at another cohort of the planner's grid, as
    a fixed run with the overrides plan=auto would give there."""
    from fedpriv.plan.auto import describe, evaluate, overrides  # noqa: PLC0415 (lazy, as above)

    runs_: dict[str, list[str]] = {}
    for name, cohort in OTHER_COHORT.items():
        given = dict(o.partition("=")[::2] for o in todo[name])
        population, epsilon = int(given["population"]), float(given["privacy.target_epsilon"])
        delta = float(given["privacy.delta"])
        # the run's compute U: its cohort x rounds (the defaults where it sets neither)
        budget = int(given.get("cohort_size", RunConfig.cohort_size)) * int(given.get("rounds", RunConfig.rounds))
        point = evaluate("bandmf", "cyclic_poisson", "rdp", population, cohort, budget // cohort, epsilon, delta)
        runs_[f"{name}_m{cohort}"] = _as_fixed(todo[name], overrides(describe(point, population, 1, budget)))
    return runs_


def row(name: str, path: Path, overrides: list[str]) -> dict | None:
    """The table row of a finished run (None while it has not finished)."""
    done = summary(path)
    if done is None:
        return None
    ledger = json.loads((path / "privacy.json").read_text())
    config = read_mapping(path / "config.yaml")
    final, best = final_and_best(path)
    return {
        "name": name,
        "overrides": overrides,
        "epsilon": ledger["epsilon"],
        "sigma": float(ledger["noise_multiplier"]),
        "mechanism": ledger["mechanism"],
        "sampling": ledger["sampling"]["kind"],
        "cohort_size": float(ledger["sampling"]["expected_cohort"]),
        "rounds": int(done["rounds"]),
        "step": float(config["optimizer"]["lr"]) * float(config["privacy"]["clip_norm"]),
        "accumulated_noise": done["noise"]["accumulated_noise"],
        "planned": done.get("plan") is not None,
        "final_accuracy": final["test_accuracy"],
        "final_loss": final["test_loss"],
        "best_loss": best["test_loss"],
        "best_round": best["round"],
        "degraded": done.get("degraded"),
        "wall_s": done.get("wall_s"),
    }


def table(rows: list[dict]) -> str:
    """A markdown table of the rows."""
    head = ("| run | ε | mechanism (sampling) | σ | cohort × rounds | lr·C | a | final acc | final loss "
            "| best loss (round) | degraded |")
    lines = []
    for r in rows:
        eps = "∞" if r["epsilon"] is None else f"{r['epsilon']:.2f}"
        a = "" if r["accumulated_noise"] is None else f"{r['accumulated_noise']:.2f}"
        lines.append(f"| {r['name']} | {eps} | {r['mechanism']} ({r['sampling']}) | {r['sigma']:.3f} | "
                     f"{r['cohort_size']:g} × {r['rounds']} | {r['step']:.3g} | {a} | {r['final_accuracy']:.4f} | "
                     f"{r['final_loss']:.3f} | {r['best_loss']:.3f} ({r['best_round']}) "
                     f"| {'yes' if r['degraded'] else 'no'} |")
    return markdown_table(head, lines)


def main() -> None:
    parser = results_parser(__doc__.splitlines()[0], Path("outputs/planner_validation"))
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (more than one: one torch thread each)")
    parser.add_argument("--real-text", type=Path, default=REAL_TEXT, help="corpus B's stackoverflow.sqlite")
    parser.add_argument("--sensitivity", action="store_true", help="the planned runs with a scaled step (docstring)")
    args = parser.parse_args()
    todo = runs(args.real_text)
    extra = {**other_cohort_runs(todo), **sensitivity_runs(args.out, todo)}
    todo.update(extra)
    check_names(args.only, todo)
    if not (args.table or args.json):
        names = args.only or [k for k in todo if (k in extra) == args.sensitivity]
        run_all(args.out, {k: todo[k] for k in names}, jobs=args.jobs)
        return
    report(args, todo, row, table)


if __name__ == "__main__":
    main()
