"""Write a small random-init Hugging Face causal LM and a word-level tokenizer to a local
directory, offline: a model directory for ``model=hf`` (and ``public.teacher=hf``) when none is
at hand, used by docs/HF_MODELS.md's command, the tests and scripts/pretrain_hf.py.

This module is the command (an entry point, the top floor: it composes the config and loads the
dataset whose words the tokenizer knows; nothing imports it); what it writes is
:func:`fedpriv.models.tiny_hf.write_model_dir`.

    python -m fedpriv.make_hf DIR [--family llama] [--hidden 64] [--layers 2] [--heads 4]
        [OVERRIDES...]   # the data whose words it knows: Hydra overrides, default +experiment=smoke
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from fedpriv.config.compose import compose_config
from fedpriv.errors import ConfigError
from fedpriv.models.tiny_hf import FAMILIES, write_model_dir
from fedpriv.task import load_dataset


def _words(overrides: Sequence[str]) -> tuple[str, ...]:
    data = compose_config(list(overrides) or ["+experiment=smoke"])["data"]
    words = load_dataset({**data, "tokenizer": "word"}).vocab.words
    if not words:
        raise ConfigError("that dataset has no word vocabulary")
    return words


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fedpriv.make_hf", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--family", choices=FAMILIES, default="llama")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides naming the data (default: +experiment=smoke)")
    args = parser.parse_intermixed_args(argv)
    try:
        if min(args.hidden, args.layers, args.heads, args.max_len) < 1 or args.hidden % args.heads:
            raise ConfigError("--hidden, --layers, --heads, --max-len must be >= 1 and --hidden divisible by --heads")
        if Path(args.directory).exists() and any(Path(args.directory).iterdir()):
            raise ConfigError(f"{args.directory} exists and is not empty")
        words = _words(args.overrides)
        out = write_model_dir(args.directory, words, args.family, args.hidden, args.layers, args.heads,
                              args.max_len, args.seed)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote a random-init {args.family} model ({len(words) + 4} token ids) and its tokenizer to {out}")


if __name__ == "__main__":
    main()
