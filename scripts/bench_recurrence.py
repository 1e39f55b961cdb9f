"""Cohort-parallel local training with the LSTM recurrence's own BPTT vs autograd through its steps.

    python scripts/bench_recurrence.py [--hidden 670] [--vocab 10004] [--clients 10] [--parallel 10]
                                       [--repeats 5] [--threads 2] [--json PATH]

One process, the two forms alternated (order rotated every repeat), medians after the first
repeat: ``CohortTrainer.updates`` (``torch.func.vmap`` over the clients' stacked parameters) of
ragged clients (8–39 sentences of 20 tokens, batch 16, 2 steps) with

* ``own BPTT``: the LSTM's lockstep form, :class:`fedpriv.models.lstm._VmappableRecurrence` (what
  the trainer runs): ``W_hh``'s gradient is one GEMM over all steps;
* ``autograd steps``: ``lockstep=False``, the unrolled form: the same steps through autograd,
  which forms ``W_hh``'s gradient per step (T−1 skinny GEMMs and T−1 adds of a [clients, 4H, H]
  tensor per local step), what the trainer ran before 2026-12-04.

Both give the same deltas (the largest relative difference is printed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedpriv.round.cohort_parallel import CohortTrainer  # noqa: E402
from fedpriv.models import LSTMLanguageModel, get_flat_params  # noqa: E402
from fedpriv.models.lstm import LSTM  # noqa: E402
from fedpriv.keys.research_key import clients_from_seed  # noqa: E402
from fedpriv.round.training import LocalConfig  # noqa: E402

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=670)
    parser.add_argument("--vocab", type=int, default=10_004)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--parallel", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    users = [rng.integers(1, args.vocab, (int(n), 21)) for n in rng.integers(8, 40, args.clients)]
    torch.manual_seed(0)
    model = LSTMLanguageModel(args.vocab, embed_dim=96, hidden_size=args.hidden, projection_dim=96)
    params = get_flat_params(model)
    trainer = CohortTrainer(model, LocalConfig(lr=0.5, batch_size=16, max_steps=2), pad_id=0, parallel=args.parallel)
    clients = clients_from_seed(0)
    lstms = [m for m in trainer.model.modules() if isinstance(m, LSTM)]
    forms = {"own BPTT": True, "autograd steps": False}  # each LSTM's lockstep flag
    times: dict[str, list[float]] = {name: [] for name in forms}
    deltas = {}
    for rep in range(args.repeats):
        for name in (list(forms) if rep % 2 else list(forms)[::-1]):
            for lstm in lstms:
                lstm.lockstep = forms[name]
            draws = [clients.draws(0, u) for u in range(len(users))]  # fresh: the draws are consumed
            start = time.perf_counter()
            deltas[name] = [d for d, _ in trainer.updates(params, users, draws)]
            times[name].append(time.perf_counter() - start)
    for lstm in lstms:
        lstm.lockstep = True
    med = {name: statistics.median(t[1:] or t) for name, t in times.items()}
    diff = max(float((a - b).norm() / a.norm()) for a, b in zip(deltas["autograd steps"], deltas["own BPTT"]))
    out = {"date": date.today().isoformat(), "torch": torch.__version__, "threads": args.threads,
           "hidden": args.hidden, "vocab": args.vocab, "clients": args.clients, "parallel": args.parallel,
           "parameters": int(params.numel()), "median_s": med, "times_s": times,
           "own_over_autograd": med["own BPTT"] / med["autograd steps"], "max_relative_delta_difference": diff}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
