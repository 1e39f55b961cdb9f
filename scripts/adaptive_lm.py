"""Issue 7's LM comparison: the DP-Adam variants as DP-FedAvg server optimizers on the transformer
LM with the synthetic default, at equal ε, with independent Gaussian noise and with BandMF.

    python scripts/adaptive_lm.py [--out outputs/adaptive_lm] [--epsilon 8] [--lr 0.01]
                                  [--only NAME ...] [--set KEY=VALUE ...] [--table] [--plot PNG]
                                  [--curves JSON] [--precond]

Runs ``python -m fedpriv.simulate model=transformer optimizer=dpadam_<variant> mechanism=<m>
privacy.target_epsilon=E optimizer.lr=LR [KEY=VALUE ...]`` into ``OUT/<mechanism>-<variant>/``
(skipping finished runs; give tuning runs their own ``--out``), then prints a Markdown table (final
accuracy, test loss, mean share of negative second-moment
coordinates where the variant has one) and, with ``--plot``, test accuracy against the round;
``--curves`` writes those curves ({run: [[round, accuracy], ...]}) to a small JSON file;
``--precond`` prints, from each finished run's last checkpoint, quantiles of the final ``√v̂`` and
of the scale ``s = 1/(√v̂ + ε)`` divided by its RMS (how far from isotropic the preconditioner is) —
for ``post`` and ``stp``, whose step divides by exactly that ``√v̂`` (``bc``/``ime`` subtract and floor).
``bc`` and ``ime`` are derived for independent Gaussian noise only, so BandMF runs ``post`` and
``stp``. ``stp`` uses the default ``optimizer.stp_normalize=rms``; ``stp_raw`` the raw ``s_t``.
Every number comes from the runs' own files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment_runs import run_once, summary  # noqa: E402  (also puts the checkout on sys.path)

from fedpriv.release.rundir import RunDirectory, write_json  # noqa: E402

RUNS = {"gaussian": ("post", "bc", "ime", "stp", "stp_raw"), "bandmf": ("post", "stp")}
LABELS = {"stp_raw": "dpadam_stp, raw s_t"}  # stp_raw: optimizer.stp_normalize=none


def names() -> list[str]:
    return [f"{m}-{v}" for m, variants in RUNS.items() for v in variants]


def overrides(name: str, epsilon: float, lr: float) -> list[str]:
    mechanism, variant = name.split("-")
    raw = variant == "stp_raw"
    return ["model=transformer", f"optimizer=dpadam_{'stp' if raw else variant}", f"mechanism={mechanism}",
            f"privacy.target_epsilon={epsilon}", f"optimizer.lr={lr}",
            *(["optimizer.stp_normalize=none"] if raw else [])]


def label(variant: str) -> str:
    return LABELS.get(variant, f"dpadam_{variant}")


def table(out: Path) -> str:
    lines = ["| mechanism | variant | final accuracy | test loss | ε | mean v_negative_fraction |",
             "|---|---|---|---|---|---|"]
    for name in names():
        s = summary(out / name)
        if s is None:
            continue
        mechanism, variant = name.split("-")
        neg = [r["v_negative_fraction"] for r in RunDirectory(out / name).read_metrics() if "v_negative_fraction" in r]
        neg_text = f"{sum(neg) / len(neg):.3f}" if neg else "—"
        lines.append(f"| {mechanism} | {label(variant)} | {s['final']['accuracy']:.4f} | {s['final']['loss']:.3f} | "
                     f"{s['privacy']['epsilon']:.3f} | {neg_text} |")
    return "\n".join(lines)


def curves(out: Path) -> dict[str, list[list[float]]]:
    """{run: [[round, test accuracy], ...]} of the finished runs."""
    return {name: [[r["round"], r["test_accuracy"]] for r in RunDirectory(out / name).read_metrics()
                   if "test_accuracy" in r]
            for name in names() if summary(out / name) is not None}


def preconditioner(out: Path, quantiles=(0.01, 0.1, 0.5, 0.9, 0.99), sample: int = 200_000) -> str:
    """Quantiles (over a seeded sample of coordinates) of the final √v̂ and of s/RMS(s), per run."""
    import torch

    from fedpriv.optim import DPAdaptive

    lines = ["| run | √v̂ quantiles (1, 10, 50, 90, 99 %) | s/RMS(s) quantiles | max s / min s |", "|---|---|---|---|"]
    q = torch.tensor(quantiles, dtype=torch.float64)
    for name in names():
        run = RunDirectory(out / name)
        if (summary(run.path) is None or not run.checkpoint_path.exists()
                or not name.split("-")[1].startswith(("post", "stp"))):
            continue
        state = run.load_checkpoint()
        cfg = state["config"]["optimizer"]  # the run's own v̂, through the server's STP scale
        opt = DPAdaptive("adam", "stp", beta2=cfg["beta2"], eps=cfg["eps"], stp_eps=cfg.get("stp_eps"),
                         stp_normalize="rms")
        opt.load_state_dict(state["server"]["optimizer"])
        v_hat, scale = opt.v_hat().double(), opt.client_scale().double()
        pick = torch.randperm(len(v_hat), generator=torch.Generator().manual_seed(0))[:sample]
        root = torch.quantile(v_hat.sqrt()[pick], q).tolist()
        normed = torch.quantile(scale[pick], q).tolist()
        lines.append(f"| {name} | {', '.join(f'{x:.2e}' for x in root)} | {', '.join(f'{x:.2f}' for x in normed)} | "
                     f"{float(scale.max() / scale.min()):.1f} |")
    return "\n".join(lines)


def plot(out: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, points in curves(out).items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3,
                label=f"{name.split('-')[0]} {label(name.split('-')[1])}")
    ax.set(xlabel="round", ylabel="test accuracy", title="DP-Adam variants (transformer, synthetic, equal ε)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("outputs/adaptive_lm"))
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--only", nargs="*", default=None, help=f"runs, in order, from: {' '.join(names())}")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra overrides for every run")
    ap.add_argument("--table", action="store_true", help="only print the table of finished runs")
    ap.add_argument("--plot", type=Path, default=None, help="also write accuracy-vs-round curves to this PNG")
    ap.add_argument("--precond", action="store_true", help="also print the final preconditioners' quantiles")
    ap.add_argument("--curves", type=Path, default=None, help="also write the curves to this JSON file")
    args = ap.parse_args()
    if not args.table:
        for name in args.only or names():
            if name not in names():
                ap.error(f"unknown run {name!r} (choose from: {' '.join(names())})")
            run_once(args.out / name, [*overrides(name, args.epsilon, args.lr), *args.set])
    print(table(args.out))
    if args.plot:
        plot(args.out, args.plot)
    if args.precond:
        print(preconditioner(args.out))
    if args.curves:
        write_json(args.curves, curves(args.out), indent=None)


if __name__ == "__main__":
    main()
