"""Pre-train a small Llama-style Hugging Face model on a dataset's public corpus and save it as a
model directory for ``model=hf`` (issue 29's experiment, docs/RESULTS.md).

It writes a random-init model and word-level tokenizer over the dataset's words
(:mod:`fedpriv.models.tiny_hf`), then runs the same public pre-training routine as the in-run
stage ``+experiment=public_pretrain`` (:func:`fedpriv.public.pretrain.pretrain`: plain SGD on the
public sentences, the same steps, batch and rate), and saves the result in place with its
tokenizer. Public data only: no privacy cost.

    .venv/bin/python scripts/pretrain_hf.py OUT [--steps 300] [--batch 64] [--lr 0.5]
        [--family llama] [--hidden 64] [--layers 2] [--heads 4] [OVERRIDES...]  # the data, default: the demo's
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--family", default="llama")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args()

    from fedpriv.config.compose import compose_config
    from fedpriv.models import get_flat_params
    from fedpriv.models.hf import HFCausalLM, save_release
    from fedpriv.models.tiny_hf import write_model_dir
    from fedpriv.public.pretrain import pretrain
    from fedpriv.public.setup import pretrain_subset
    from fedpriv.task import load_dataset

    data_cfg = compose_config(args.overrides)["data"]
    words = load_dataset({**data_cfg, "tokenizer": "word"}).vocab.words
    write_model_dir(args.out, words, args.family, args.hidden, args.layers, args.heads, seed=args.seed)
    data = load_dataset({**data_cfg, "tokenizer": "hf", "tokenizer_path": args.out,
                         "sp_seq_len": data_cfg["seq_len"]})
    if data.public is None:
        raise SystemExit("error: that dataset has no public corpus (data.public_source)")
    model = HFCausalLM.load(args.out, data.vocab.size, data.vocab.pad_id)
    rows = pretrain_subset(len(data.public.sentences), 1.0, args.seed)
    started = time.perf_counter()
    params, stats = pretrain(model, data.public.sentences[rows], args.steps, args.batch, args.lr, args.seed,
                             data.vocab.pad_id)
    wall = time.perf_counter() - started
    save_release(model, params, args.out, data.tokenizer)
    total = get_flat_params(model).numel()
    print(f"pre-trained a {args.family} of {total:,} parameters on {int(stats['public_sentences_used'])} public "
          f"sentences, {args.steps} steps in {wall:.1f} s: loss {stats['public_loss_first']:.3f} -> "
          f"{stats['public_loss_last']:.3f}; saved to {args.out}")


if __name__ == "__main__":
    main()
