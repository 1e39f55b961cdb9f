"""The sparse 1-D logistic regression of "On Design Principles for Private Adaptive Optimizers",
with DP-AdaGrad: which second-moment estimate works when most gradients are zero?

Setup (per trial): n = 1000 samples, x_i = 0 with probability 0.9 and 1 otherwise, labels
y_i ∈ {±1} with P(y = 1 | x) = sigmoid(w* x), w* = 2. One pass of batch-1 DP-SGD-style steps from
w = 0: per-sample gradient g_i = −y_i x_i sigmoid(−y_i w x_i) (|g_i| ≤ 1 = the clip C, so clipping
never binds), Gaussian noise with multiplier σ = 0.1 on every step (zero gradients included — the
sparsity is not public). The variants (fedpriv.optim.adaptive, the same code the FL server runs)
differ in the preconditioner v:

* post: v += (g + z)²            (post-processing; noise variance accumulates in zero steps)
* bc:   v += (g + z)² − σ²C²     (bias-corrected, floored)
* ime:  v += g² + z'             (independent moment estimate; σ split σ/√(1−ρ), σ/√ρ, ρ = 1/2)
* stp:  scale by 1/(√v + ε) before clipping and noising, unscale after
* noiseless: v += g² (NOT private; reference)

Metric: excess population loss L(w_T) − L(w*) on the x = 1 part (x = 0 costs log 2 whatever w is),
mean over 30 independent trials (different data and noise), each variant at its best learning rate
and AdaGrad ε from a grid (chosen on the mean). The 30 trials run as 30 coordinates of one vector (AdaGrad is
coordinate-wise).

    python scripts/adaptive_1d.py [--trials 30] [--samples 1000] [--sigma 0.1] [--json]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpriv.optim.adaptive import DPAdaptive, RoundRelease  # noqa: E402
from fedpriv.release.rundir import json_text  # noqa: E402

W_STAR = 2.0
LRS = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
EPSILONS = (1e-3, 1e-2, 1e-1)  # AdaGrad's ε (stability constant), tuned with the learning rate
VARIANTS = ("post", "bc", "ime", "stp", "noiseless")


def excess_loss(w: torch.Tensor) -> torch.Tensor:
    """L(w) − L(w*) on x = 1 with P(y = 1) = sigmoid(w*)."""
    p = torch.sigmoid(torch.tensor(W_STAR, dtype=w.dtype))

    def loss(v):
        return -(p * torch.nn.functional.logsigmoid(v) + (1 - p) * torch.nn.functional.logsigmoid(-v))

    return loss(w) - loss(torch.full_like(w, W_STAR))


def run(variant: str, lr: float, eps: float, trials: int, samples: int, sigma: float, seed: int) -> torch.Tensor:
    """Final excess loss of each trial."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.rand(samples, trials, generator=gen, dtype=torch.float64) < 0.1).double()
    y = torch.where(torch.rand(samples, trials, generator=gen, dtype=torch.float64) < torch.sigmoid(W_STAR * x),
                    1.0, -1.0).double()
    noise = torch.randn(samples, trials, generator=gen, dtype=torch.float64)
    noise_sq = torch.randn(samples, trials, generator=gen, dtype=torch.float64)
    opt = DPAdaptive("adagrad", variant, lr=lr, eps=eps, floor=1e-12, ime_fraction=0.5)
    split_update, split_squares = opt.noise_split()
    w = torch.zeros(trials, dtype=torch.float64)
    clip = 1.0
    for i in range(samples):
        g = -y[i] * x[i] * torch.sigmoid(-y[i] * w * x[i])
        scale = opt.client_scale()
        if scale is not None:
            g = g * scale
        g = g * torch.clamp(clip / g.abs().clamp_min(1e-300), max=1.0)  # per-sample clip (1-D: |g| ≤ C)
        squares = g * g + noise_sq[i] * sigma * split_squares * clip ** 2
        noisy = g + noise[i] * sigma * split_update * clip
        if scale is not None:
            noisy = noisy / scale
        release = RoundRelease(update=-noisy, noise_std=sigma * clip, squares=squares,
                               noiseless=-(g / scale if scale is not None else g))
        w, _ = opt.step_release(w, release)
    return excess_loss(w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--sigma", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = {}
    for variant in VARIANTS:
        grid = {(lr, eps): run(variant, lr, eps, args.trials, args.samples, args.sigma, args.seed)
                for lr in LRS for eps in EPSILONS}
        best = min(grid, key=lambda key: float(grid[key].mean()))
        losses = grid[best]
        results[variant] = {"best_lr": best[0], "best_eps": best[1], "mean_excess_loss": float(losses.mean()),
                            "stderr": float(losses.std() / math.sqrt(len(losses))),
                            "grid": {f"lr={lr:g},eps={eps:g}": float(v.mean()) for (lr, eps), v in grid.items()}}
    if args.json:
        print(json_text({"setup": vars(args), "results": results}, indent=2))
        return
    print(f"sparse 1-D logistic regression, DP-AdaGrad, {args.trials} trials x {args.samples} samples, "
          f"sigma {args.sigma}, clip 1 (excess loss at the best lr, mean +- stderr)")
    for variant, r in results.items():
        tag = " (NOT private)" if variant == "noiseless" else ""
        print(f"  {variant:10s} lr {r['best_lr']:<6g} eps {r['best_eps']:<6g} excess loss "
              f"{r['mean_excess_loss']:.4f} +- {r['stderr']:.4f}{tag}")


if __name__ == "__main__":
    main()
