"""Per-sample clipping step time: non-private vs Book-Keeping (each mode) vs Opacus vs torch.func.

    python scripts/bench_clipping.py --model transformer [--steps 12] [--json PATH] [--no-memory]
    python scripts/bench_clipping.py --model lstm
    python scripts/bench_clipping.py --model gpt2

One step = forward, per-sample losses (mean token cross-entropy of each sequence), clipped
per-sample gradient sum + Gaussian noise (σ = 1, C = 1), SGD update. Every mode owns its own
copy of the same initial model and sees the same batch. Timing is round-robin: each of
``--steps`` iterations runs one step of every mode in turn (after ``--warmup`` untimed ones), the
order rotated by one mode each iteration (so no mode always follows the same one: what a mode
leaves in the allocator and caches otherwise biases the next), so this machine's speed drift
hits all modes alike; we report the median step time and its ratio to the non-private step.
``--modes`` restricts the run to some modes (e.g. ``"non-private,BK mixopt"``: interleaved pairs).
Peak memory is the peak RSS of a fresh child process running only that
mode (``--only MODE``), since one process's peak cannot be split between modes.

Configs (ANCHORS.md): transformer vocab 10000, d 256, 4 layers, 4 heads, ff 1024, T 64, batch 32,
untied head; LSTM vocab 10000, embed 96, LSTM 670, projection 96, T 20, batch 32. The LSTM
baseline is ``nn.LSTM`` (cuDNN-style fused kernel); "non-private unrolled" is fedpriv's LSTM
stepped through its Linear gates, the form every per-sample method needs. gpt2: a random-init
Hugging Face ``GPT2LMHeadModel`` (``GPT2_CONFIG``: vocab 10000, n_embd 304, 5 layers, 4 heads,
inner 1216, 64 positions, dropout 0, tied embeddings as GPT-2 has: 8,624,784 parameters), T 64,
batch 32, forward ``model(input_ids).logits`` with GPT-2 making its own positions (Opacus gets
``position_ids`` expanded to [B, T], as the transformer's Opacus copy). A mode that cannot be built
(e.g. Opacus refusing a layer) is reported with its error instead of a number.
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import warnings

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedpriv.clipping import BookKeeping  # noqa: E402
from fedpriv.clipping.engine import REPLAY_EVERY  # noqa: E402
from fedpriv.models import LSTMLanguageModel, TransformerLanguageModel  # noqa: E402
from fedpriv.release.rundir import write_json  # noqa: E402

VOCAB = 10000
CONFIGS = {
    "transformer": dict(seq=64, batch=32),
    "lstm": dict(seq=20, batch=32),
    "gpt2": dict(seq=64, batch=32),
}
# ≈ 8.6M parameters with tied embeddings (n_embd 256 / 4 layers would be 5.7M): 8,624,784
GPT2_CONFIG = dict(vocab_size=VOCAB, n_positions=64, n_embd=304, n_layer=5, n_head=4, n_inner=None,
                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                   bos_token_id=0, eos_token_id=0)
SIGMA, CLIP, LR = 1.0, 1.0, 0.1
warnings.filterwarnings("ignore", message="Full backward hook is firing")


class BatchedPositions(TransformerLanguageModel):
    """The same transformer, with position ids expanded to [B, T] (Opacus needs batch-first
    inputs for every layer; fedpriv's BK handles the shared [T] form too)."""

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1]).repeat(tokens.shape[0], 1)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)


class HFLogits(nn.Module):
    """``model(input_ids).logits`` of a Hugging Face causal LM; ``batched_positions`` passes
    ``position_ids`` expanded to [B, T] (Opacus needs batch-first inputs for every layer; fedpriv's
    BK takes the [1, T] positions GPT-2 makes itself)."""

    def __init__(self, model: nn.Module, batched_positions: bool = False) -> None:
        super().__init__()
        self.model = model
        self.batched_positions = batched_positions

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.batched_positions:
            positions = torch.arange(tokens.shape[1]).repeat(tokens.shape[0], 1)
            return self.model(tokens, position_ids=positions).logits
        return self.model(tokens).logits


def gpt2_model(batched_positions: bool = False) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return HFLogits(GPT2LMHeadModel(GPT2Config(**GPT2_CONFIG)), batched_positions)


class RecurrentLM(nn.Module):
    """Embedding → ``rnn`` (nn.LSTM or Opacus DPLSTM, batch-first) → projection → output."""

    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, 96, padding_idx=0)
        self.rnn = rnn
        self.projection = nn.Linear(670, 96)
        self.output = nn.Linear(96, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embedding(tokens))
        return self.output(self.projection(hidden))


def fedpriv_model(name: str) -> nn.Module:
    if name == "gpt2":
        return gpt2_model()
    torch.manual_seed(0)
    if name == "transformer":
        return TransformerLanguageModel(VOCAB, d_model=256, num_layers=4, num_heads=4, ff_dim=1024, max_len=64)
    return LSTMLanguageModel(VOCAB, embed_dim=96, hidden_size=670, projection_dim=96)


def copy_weights(src: nn.Module, dst: nn.Module) -> nn.Module:
    """Load fedpriv LSTM LM weights into a RecurrentLM (same gate order i, f, g, o)."""
    s = src.state_dict()
    with torch.no_grad():
        dst.embedding.weight.copy_(s["embedding.weight"])
        dst.projection.weight.copy_(s["projection.weight"])
        dst.projection.bias.copy_(s["projection.bias"])
        dst.output.weight.copy_(s["output.weight"])
        dst.output.bias.copy_(s["output.bias"])
        rnn = dst.rnn  # nn.LSTM and Opacus DPLSTM name their weights alike
        rnn.weight_ih_l0.copy_(s["lstm.ih.weight"])
        rnn.weight_hh_l0.copy_(s["lstm.hh.weight"])
        rnn.bias_ih_l0.copy_(s["lstm.ih.bias"])
        rnn.bias_hh_l0.zero_()
    return dst


def per_sample_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=0,
                         reduction="none").view_as(targets)
    return ce.sum(1) / (targets != 0).sum(1).clamp(min=1)


def sgd(params, batch: int) -> None:
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-LR / batch)
            p.grad = None


def make_batch(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The benchmark's fixed batch (inputs, targets) for ``name``; a quarter of it padded."""
    cfg = CONFIGS[name]
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, VOCAB, (cfg["batch"], cfg["seq"] + 1), generator=gen)
    tokens[: cfg["batch"] // 4, cfg["seq"] // 2:] = 0  # some padded sequences
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def make_steps(name: str, only: str | None = None) -> dict:
    """Mode name → a zero-argument step function (all modes start from the same weights)."""
    x, y = make_batch(name)
    batch = x.shape[0]
    reference = fedpriv_model(name)
    steps: dict = {}

    def want(mode: str) -> bool:
        return only is None or only == mode

    def plain(model: nn.Module):
        params = [p for p in model.parameters() if p.requires_grad]

        def step():
            per_sample_loss(model(x), y).sum().backward()
            sgd(params, batch)
        return step

    if name == "lstm":
        if want("non-private"):
            steps["non-private"] = plain(copy_weights(reference, RecurrentLM(nn.LSTM(96, 670, batch_first=True))))
        if want("non-private unrolled"):
            unrolled = fedpriv_model(name)
            unrolled.lstm.unrolled = True
            steps["non-private unrolled"] = plain(unrolled)
    elif want("non-private"):
        steps["non-private"] = plain(fedpriv_model(name))

    # "BK mixopt σ=0": clipping alone; what the noise draw costs is its difference to "BK mixopt".
    # The forward replay (the sample-mixing check) runs on an engine's first 4 steps, all in the
    # warm-up, then on every replay_every-th: "replay every step" and "no replay" bracket its cost.
    for label, mode, sigma, every in (("BK ghost", "ghost", SIGMA, REPLAY_EVERY),
                                      ("BK instantiate", "instantiate", SIGMA, REPLAY_EVERY),
                                      ("BK mixopt", "mixopt", SIGMA, REPLAY_EVERY),
                                      ("BK mixopt σ=0", "mixopt", 0.0, REPLAY_EVERY),
                                      ("BK mixopt replay every step", "mixopt", SIGMA, 1),
                                      ("BK mixopt no replay", "mixopt", SIGMA, NO_REPLAY)):
        if not want(label):
            continue
        model = fedpriv_model(name)
        bk = BookKeeping(model, clip_norm=CLIP, noise_multiplier=sigma, mode=mode, replay_every=every)

        def bk_step(model=model, bk=bk, label=label):
            logits = model(x)
            REPLAYED.setdefault(label, []).append(bk.replay_pending)
            bk.backward(per_sample_loss(logits, y))
            del logits
            sgd([p for p in model.parameters() if p.requires_grad], batch)
        steps[label] = bk_step

    if want("torch.func vmap"):
        steps["torch.func vmap"] = vmap_step(fedpriv_model(name), x, y, batch)

    try:
        import opacus  # noqa: F401
    except ImportError:
        return steps
    for ghost in (False, True):
        mode = "Opacus ghost" if ghost else "Opacus hooks"
        if want(mode):
            try:
                steps[mode] = opacus_step(name, reference, x, y, batch, ghost)
            except Exception as exc:  # report the refusal, never a number
                REFUSED[mode] = f"{type(exc).__name__}: {exc}"
    return steps


#: mode -> why it could not run (its error), filled by make_steps and the first timed step
REFUSED: dict[str, str] = {}
#: BK mode -> for each of its steps (warm-up included), whether the engine replayed its forward
REPLAYED: dict[str, list[bool]] = {}


def vmap_step(model: nn.Module, x, y, batch: int):
    from torch.func import functional_call, grad, vmap

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]

    def loss_one(weights, xi, yi):
        logits = functional_call(model, dict(zip(names, weights)), (xi[None],))
        return per_sample_loss(logits, yi[None])[0]

    per_sample_grad = vmap(grad(loss_one), in_dims=(None, 0, 0))

    def step():
        grads = per_sample_grad(tuple(p.detach() for p in params), x, y)
        norms = torch.sqrt(sum(g.reshape(batch, -1).pow(2).sum(1) for g in grads))
        scale = (CLIP / norms.clamp(min=CLIP))
        for p, g in zip(params, grads):
            p.grad = torch.einsum("b,b...->...", scale, g) + SIGMA * CLIP * torch.randn_like(p)
        sgd(params, batch)
    return step


def opacus_step(name: str, reference: nn.Module, x, y, batch: int, ghost: bool):
    from opacus import GradSampleModule
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.layers import DPLSTM
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping

    if name == "lstm":
        model = copy_weights(reference, RecurrentLM(DPLSTM(96, 670, batch_first=True)))
    elif name == "gpt2":
        model = gpt2_model(batched_positions=True)
    else:
        torch.manual_seed(0)
        model = BatchedPositions(VOCAB, d_model=256, num_layers=4, num_heads=4, ff_dim=1024, max_len=64)
    if ghost:
        module = GradSampleModuleFastGradientClipping(model, max_grad_norm=CLIP, use_ghost_clipping=True,
                                                      loss_reduction="sum")
        opt = DPOptimizerFastGradientClipping(torch.optim.SGD(module.parameters(), lr=LR / batch),
                                              noise_multiplier=SIGMA, max_grad_norm=CLIP,
                                              expected_batch_size=batch, loss_reduction="sum")

        def step():
            opt.zero_grad()
            DPTensorFastGradientClipping(module, opt, per_sample_loss(module(x), y), "sum").backward()
            opt.step()
        return step
    module = GradSampleModule(model, loss_reduction="sum")
    opt = DPOptimizer(torch.optim.SGD(module.parameters(), lr=LR / batch), noise_multiplier=SIGMA,
                      max_grad_norm=CLIP, expected_batch_size=batch, loss_reduction="sum")

    def step():
        opt.zero_grad()
        per_sample_loss(module(x), y).sum().backward()
        opt.step()
    return step


NO_REPLAY = 10**9  # replays only in the first 4 steps (the warm-up, with --warmup 4)


def time_round_robin(steps: dict, iters: int, warmup: int) -> dict[str, list[float]]:
    """Per mode, the times of ``iters`` steps; iteration i runs the modes in order rotated by i."""
    times: dict[str, list[float]] = {mode: [] for mode in steps}
    order = list(steps.items())
    for i in range(warmup + iters):
        shift = i % len(order)
        for mode, step in order[shift:] + order[:shift]:
            if mode in REFUSED:
                continue
            start = time.perf_counter()
            try:
                step()
            except Exception as exc:  # e.g. Opacus refusing a layer at its first backward
                if mode == "non-private" or times[mode]:
                    raise
                REFUSED[mode] = f"{type(exc).__name__}: {exc}"
                continue
            elapsed = time.perf_counter() - start
            if i >= warmup:
                times[mode].append(elapsed)
    return {mode: ts for mode, ts in times.items() if mode not in REFUSED}


def peak_rss_self_mb() -> float:
    """This process's peak RSS (VmHWM; unlike ru_maxrss it is not inherited across fork+exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_rss_mb(model: str, mode: str, threads: int) -> float | None:
    """Peak RSS (MB) of a fresh process running 3 steps of ``mode`` only."""
    proc = subprocess.run([sys.executable, __file__, "--model", model, "--only", mode, "--threads", str(threads)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"memory run of {mode!r} failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return float(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(CONFIGS), required=True)
    parser.add_argument("--steps", type=int, default=12, help="timed round-robin iterations")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-mode peak-RSS child processes")
    parser.add_argument("--modes", help="comma-separated modes to run (default: all; non-private is always run)")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # child: run one mode, print peak RSS MB
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    if args.only:
        built = make_steps(args.model, only=args.only)
        if args.only not in built:
            sys.exit(f"{args.only}: {REFUSED.get(args.only, 'unknown mode')}")
        step = built[args.only]
        for _ in range(3):
            step()
        print(peak_rss_self_mb())
        return

    steps = make_steps(args.model)
    if args.modes:
        wanted = ["non-private"] + [m.strip() for m in args.modes.split(",") if m.strip() != "non-private"]
        unknown = [m for m in wanted if m not in steps and m not in REFUSED]
        if unknown:
            parser.error(f"unknown mode(s) {unknown}; known: {sorted(steps)}")
        steps = {m: steps[m] for m in wanted if m in steps}
        for mode in [m for m in REFUSED if m not in wanted]:
            del REFUSED[mode]
    times = time_round_robin(steps, args.steps, args.warmup)
    base = statistics.median(times["non-private"])
    memory = {} if args.no_memory else {mode: peak_rss_mb(args.model, mode, args.threads) for mode in times}
    base_mem = memory.get("non-private")
    rows = []
    n_params = sum(p.numel() for p in fedpriv_model(args.model).parameters())  # tied weights once
    print(f"{args.model}: {n_params:,} parameters, {args.steps} round-robin steps after {args.warmup} warm-up, "
          f"{args.threads} threads, torch {torch.__version__}")
    print(f"{'mode':24s} {'median s':>9s} {'ratio':>6s} {'peak RSS MB':>12s} {'mem ratio':>9s}")
    notes = []
    for mode, ts in times.items():
        med = statistics.median(ts)
        mem = memory.get(mode)
        row = {"mode": mode, "median_s": med, "ratio": med / base, "peak_rss_mb": mem,
               "memory_ratio": (mem / base_mem) if mem and base_mem else None, "times_s": ts}
        replayed = REPLAYED.get(mode, [])[args.warmup:args.warmup + len(ts)]
        if any(replayed):  # the timed steps the forward replay ran on, and the medians of both kinds
            row["replayed"] = replayed
            again = [t for t, r in zip(ts, replayed) if r]
            plain = [t for t, r in zip(ts, replayed) if not r]
            which = ", ".join(str(i) for i, r in enumerate(replayed) if r)
            others = (f"; the others {statistics.median(plain):.4f} s ({statistics.median(plain) / base:.2f})"
                      if plain else "")
            notes.append(f"{mode}: {len(again)} of {len(ts)} timed steps replayed (timed steps {which}), median "
                         f"{statistics.median(again):.4f} s ({statistics.median(again) / base:.2f})" + others)
        rows.append(row)
        mem_text = f"{mem:12.0f} {row['memory_ratio']:9.2f}" if mem and base_mem else f"{'-':>12s} {'-':>9s}"
        print(f"{mode:24s} {med:9.4f} {med / base:6.2f} {mem_text}")
    for note in notes:
        print(note)
    for mode, why in REFUSED.items():
        print(f"{mode:24s} refused: {why}")
    if args.json:
        write_json(args.json, {"model": args.model, "steps": args.steps, "threads": args.threads,
                               "date": time.strftime("%Y-%m-%d"),
                               "torch": torch.__version__, "machine": platform.machine(),
                               "config": CONFIGS[args.model], "parameters": n_params, "results": rows,
                               "refused": dict(REFUSED)})


if __name__ == "__main__":
    main()
