"""Issue 55's validation: ``plan=auto`` at ε ∈ {8, 4, 2} with and without a public corpus, against
non-private runs at equal compute, on the real-text corpus; and the synthetic default at ε = 2 and 8.

Each run is one ``python -m fedpriv.simulate`` subprocess into ``OUT/<name>/`` (resumable: a run
whose summary.json exists is skipped); ``--jobs 2`` runs two at a time with one torch thread each
(accuracy is compared, not wall time). Pre-trained models are cached (``$FEDPRIV_CACHE/pretrained``),
so the runs that share a pre-training pay for it once.

    python scripts/strong_privacy_validation.py --corpus DIR [--out outputs/strong_privacy] [--jobs 2] [--only NAME ...]
    python scripts/strong_privacy_validation.py --corpus DIR --table [--json docs/results/strong_privacy.json]

Corpus C: ``scripts/build_real_text_corpus.py --out DIR`` (2,559 train users; users.jsonl read with
``data=files``; its ``public.txt``, manual-page sentences, is the public corpus: a disjoint source),
the default LSTM (1.40M parameters), U = 15,000 client updates, δ = 1e-5. ``C_auto[_pub]_eps{8,4,2}``:
planned without / with the public corpus; ``C_np[_pub]_lr{1,4}``: non-private (σ = 0, clip 1,
momentum 0.9, cosine) at the ε = 2 plan's cohort × rounds (137 × 109), without / with the planned
pre-training (3,125 steps: 10 epochs of the 20,000 public sentences read by default), server lr 1 and
4 (4: the best non-private step of the calibration runs, docs/PLANNER.md); ``C_pub_eps2_a{0.5,0.125}``:
the ε = 2 public plan with the step of a = 0.5 (the from-scratch target) or 0.125 instead of the
planned 0.25, as a fixed run with the plan's overrides (another research key: another noise draw).
``A_auto_eps{8,2}``: the synthetic default (10,000 users, its embedded public corpus, U = 33,000)
planned. One seed: an indication at the scale this machine allows.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment_runs import check_names, report, results_parser, run_all  # noqa: E402
from planner_validation import row as validation_row, table as validation_table  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpriv.release.rundir import read_mapping  # noqa: E402

REAL_USERS = 2559  # the corpus's train users (docs/REAL_TEXT.md): public by construction here
BUDGET = 15_000
NONPRIVATE = ["plan=fixed", "cohort_size=137", "rounds=109", "sampling=poisson", "mechanism=gaussian",
              "privacy.noise_multiplier=0", "privacy.clip_norm=1.0", "optimizer.momentum=0.9",
              "optimizer.schedule=cosine"]
PRETRAIN = ["public.pretrain_steps=3125", "public.pretrain_batch_size=64", "public.pretrain_lr=0.5"]
# the epsilon-2 public plan's overrides (python -m fedpriv.plan prints them) but the step: that of a = 0.5
# (the from-scratch target) or a = 0.125 instead of the planned 0.25
EPS2_STEP = {"0.5": 0.42414617954618306, "0.125": 0.10603654488654577}
EPS2_FIXED = ["plan=fixed", "cohort_size=137", "rounds=109", "sampling=poisson", "mechanism=gaussian",
              "privacy.accountant=rdp", "privacy.clip_norm=1.0", "optimizer.momentum=0.9", "optimizer.schedule=cosine",
              "privacy.target_epsilon=2"]


def runs(corpus: Path) -> dict[str, list[str]]:
    """name → overrides, in the order they run."""
    files = ["data=files", f"data.path={corpus / 'users.jsonl'}", "data.user_column=user", "data.text_column=text",
             "data.split_column=split", "data.preprocess=none",
             f"data.vocab_path={corpus / 'stackoverflow.word_count'}", f"population={REAL_USERS}"]
    public = ["data.public_source=text", f"data.public_path={corpus / 'public.txt'}"]
    out: dict[str, list[str]] = {}
    for eps in (2, 8, 4):
        planned = [*files, "plan=auto", f"privacy.target_epsilon={eps}", f"plan.client_updates={BUDGET}"]
        out[f"C_auto_pub_eps{eps}"] = [*planned, *public]
        out[f"C_auto_eps{eps}"] = planned
    for lr in (1, 4):
        out[f"C_np_pub_lr{lr}"] = [*files, *NONPRIVATE, f"optimizer.lr={lr}", *public, *PRETRAIN]
        out[f"C_np_lr{lr}"] = [*files, *NONPRIVATE, f"optimizer.lr={lr}"]
    for a, lr in EPS2_STEP.items():
        out[f"C_pub_eps2_a{a}"] = [*files, *EPS2_FIXED, f"optimizer.lr={lr!r}", *public, *PRETRAIN]
    for eps in (2, 8):
        out[f"A_auto_eps{eps}"] = ["privacy.delta=1e-5", f"privacy.target_epsilon={eps}", "plan=auto",
                                   "population=10000"]
    return out


def row(name: str, path: Path, overrides: list[str]) -> dict | None:
    """:func:`planner_validation.row` with the public pre-training's steps (0: none)."""
    base = validation_row(name, path, overrides)
    if base is None:
        return None
    base["pretrain_steps"] = int(read_mapping(path / "config.yaml")["public"]["pretrain_steps"])  # the executed config
    return base


def table(rows: list[dict]) -> str:
    """The validation table with a pre-training column."""
    lines = validation_table(rows).splitlines()
    head = lines[0].replace("| run |", "| run | pre-training steps |")
    sep = lines[1].replace("|---|", "|---|---|", 1)
    body = [line.replace(f"| {r['name']} |", f"| {r['name']} | {r['pretrain_steps']} |", 1)
            for line, r in zip(lines[2:], rows)]
    return "\n".join([head, sep, *body])


def main() -> None:
    parser = results_parser(__doc__.splitlines()[0], Path("outputs/strong_privacy"))
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (more than one: one torch thread each)")
    parser.add_argument("--corpus", type=Path, default=Path("outputs/real_text"),
                        help="the directory scripts/build_real_text_corpus.py wrote")
    args = parser.parse_args()
    todo = runs(args.corpus)
    check_names(args.only, todo)
    if not (args.table or args.json):
        run_all(args.out, {k: todo[k] for k in (args.only or todo)}, jobs=args.jobs)
        return
    report(args, todo, row, table)


if __name__ == "__main__":
    main()
