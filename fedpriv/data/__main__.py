"""``python -m fedpriv.data COMMAND``: a data owner's tools for ``data=files``, before training.

    python -m fedpriv.data word-counts PUBLIC_TEXT [--text-field text] [--min-count 2] -o FILE [--force]
    python -m fedpriv.data inspect data=files data.path=PATH data.user_column=COL data.text_column=COL \\
        data.vocab_path=FILE [key=value ...] [--all] [--json]

``word-counts`` counts the words of public text (never your users' own: a vocabulary counted on
them is private) in TFF's word-count format (``word<TAB>count``, most frequent first), the file
``data.vocab_path`` takes. PUBLIC_TEXT is what ``data.public_source=text`` reads: ``.txt`` files
(one document per line) or ``.jsonl``/``.json`` files with a ``--text-field``, optionally ``.gz``;
a directory or a glob of them. Its sentences are normalised as ``data=files``' ``preprocess=tff``
normalises the users' rows (:func:`fedpriv.text.corpora.sentences`), so the words match; words seen
fewer than ``--min-count`` times are left out. FILE is written atomically and never replaced
unless ``--force``.

``inspect`` takes the settings of a run (``key=value`` overrides, read and checked as
``python -m fedpriv.simulate`` reads them: it refuses what a run refuses) and prints what that run
will see (:mod:`fedpriv.data.files_inspect`): the files and columns, the index (built now, or found
in the cache, which the run then opens warm), the test split and how it was made, users, rows,
sentences and tokens per train user (quantiles over a sample of 2,000 train users drawn with
``data.seed``; ``--all``: every user), the share of words the vocabulary or tokenizer maps to the
unknown token, and the ``population=N plan=auto`` command to run next. Its first line says it: this
is your own view of your private data, not a release; it writes no run directory and nothing of it
goes into a run. ``--json`` prints the same as one JSON object. It reads ``data=files`` only (a
StackOverflow file has its own checks: ``python -m fedpriv.plan data=stackoverflow ...``).

Bad input (a missing or corrupt file, a missing column, an empty text, a user column of mixed
types, no train row, an existing FILE): one ``error:`` line, exit 2, nothing written; a write that
fails (a full disk): one ``error:`` line, exit 1.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from fedpriv.release.atomic import create_bytes_atomic, write_atomic
from fedpriv.config.compose import check_overrides
from fedpriv.config.resolve import run_config
from fedpriv.release.console import OneLineParser, console_logging, fail
from fedpriv.data.files import NAME as FILES
from fedpriv.data.files_inspect import inspect_files, lines
from fedpriv.errors import ConfigError, OutputError
from fedpriv.plan.auto import grid_problem
from fedpriv.release.rundir import json_text
from fedpriv.text.corpora import public_word_counts
from fedpriv.text.vocabulary import word_count_text

COMMANDS = ("inspect", "word-counts")
DEFAULT_EPSILON = "8"  # the target the suggested plan=auto command names unless the settings give one


def _output_failure(err: OutputError) -> None:
    print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
    sys.exit(1)


# --- inspect --------------------------------------------------------------------------------------

def next_command(overrides: list[str], population: int) -> str:
    """The ``python -m fedpriv.simulate`` command of these settings planned by ``plan=auto`` for
    ``population`` users (the settings' own ``population``/``plan`` replaced; ε 8 unless given)."""
    keys = [o.partition("=")[0].lstrip("+~") for o in overrides]
    kept = [o for o, k in zip(overrides, keys) if k not in ("population", "plan")]
    extra = [f"population={population}", "plan=auto"]
    if not any(k in ("privacy.target_epsilon", "privacy.noise_multiplier") for k in keys):
        extra.append(f"privacy.target_epsilon={DEFAULT_EPSILON}")
    return "python -m fedpriv.simulate " + shlex.join(kept + extra)


def inspect_command(args: list[str]) -> None:
    """``inspect [OVERRIDES...] [--all] [--json]`` (the module docstring)."""
    every, as_json = "--all" in args, "--json" in args
    overrides = [a for a in args if a not in ("--all", "--json")]
    for a in overrides:
        if a.startswith("-"):
            fail(f"{a!r} is not an option of inspect (--all, --json); settings are key=value overrides, e.g. "
                 "data.path=rows.jsonl")
    try:
        members = check_overrides(overrides, multirun=True)
        if len(members) > 1:
            raise ConfigError(f"inspect looks at one data setting, not a sweep of {len(members)}: give each key one "
                              "value")
        spec = run_config(members[0][1])
        if spec.data.name != FILES:
            raise ConfigError(f"inspect looks at your own files: add data={FILES} with data.path, data.user_column "
                              f"and data.text_column (this is data={spec.data.name}; python -m fedpriv.plan shows "
                              "what a run of it plans)")
        report = inspect_files(spec.data, every_user=every)
    except ConfigError as err:
        fail(str(err))
    except OutputError as err:
        _output_failure(err)
    report["next"] = next_command(overrides, report["population"])
    # the planner's own check of that command's population and budget (plan.client_updates, else cohort x rounds)
    budget = getattr(spec.plan, "client_updates", None) or spec.cohort_size * spec.rounds
    report["next_problem"] = grid_problem(report["population"], budget)
    if report["next_problem"]:
        print(f"warning: the next command will not plan: {report['next_problem']} (or use plan=fixed with your own "
              "cohort_size and rounds)", file=sys.stderr)
    print(json_text(report, indent=2) if as_json else "\n".join(lines(report)))


# --- word-counts ----------------------------------------------------------------------------------

def _word_counts_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m fedpriv.data word-counts",
                           description="Count the words of public text in TFF's word-count format.")
    parser.add_argument("public_path", help="public text: .txt / .jsonl / .json files (optionally .gz), a directory "
                                            "or a glob")
    parser.add_argument("--text-field", default="text", help="the text field of JSON records (default: text)")
    parser.add_argument("--min-count", type=int, default=2, help="leave out words seen fewer times (default: 2)")
    parser.add_argument("-o", "--output", required=True, type=Path, help="the word-count file to write")
    parser.add_argument("--force", action="store_true", help="replace FILE if it exists")
    return parser


def word_counts_command(args: list[str]) -> None:
    """``word-counts PUBLIC_PATH [--text-field F] [--min-count N] -o FILE [--force]`` (the module docstring)."""
    opts = _word_counts_parser().parse_args(args)
    out: Path = opts.output
    try:
        if opts.min_count < 1:
            raise ConfigError(f"--min-count must be 1 or more, got {opts.min_count}")
        if out.is_dir():
            raise ConfigError(f"-o {out} is a directory: name the word-count file to write")
        if not opts.force and (out.exists() or out.is_symlink()):
            raise ConfigError(f"{out} already exists: pass --force to replace it, or another -o")
        if not out.parent.is_dir():
            raise ConfigError(f"the directory of -o {out} does not exist")
        counts = public_word_counts(opts.public_path, opts.text_field)
        text = word_count_text(counts, opts.min_count).encode()
    except ConfigError as err:
        fail(str(err))
    try:
        if opts.force:
            write_atomic(out, text)
        else:
            create_bytes_atomic(out, text)
    except FileExistsError:
        fail(f"{out} appeared while it was being written: it is left as it is; pass --force to replace it")
    except OutputError as err:
        _output_failure(err)
    except OSError as err:
        _output_failure(OutputError(f"cannot write {out}: {err.strerror or err}; nothing was written"))
    kept = text.count(b"\n")
    print(f"wrote {out}: {kept:,} words seen {opts.min_count} times or more (of {len(counts):,} distinct, "
          f"{sum(counts.values()):,} in all) in {opts.public_path}, most frequent first")
    print(f"use it with: data.vocab_path={shlex.quote(str(out))} data.vocab_size={min(kept, 10000)}")


def main(argv: list[str] | None = None) -> None:
    console_logging()  # a load's warnings (an unknown-word share above a quarter) as warning: lines
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or (args[0] == "inspect" and ("-h" in args or "--help" in args)):
        print(__doc__.strip())
        return
    command, rest = args[0], args[1:]
    if command == "inspect":
        inspect_command(rest)
    elif command == "word-counts":
        word_counts_command(rest)
    else:
        fail(f"unknown command {command!r}: python -m fedpriv.data {' | '.join(COMMANDS)} (--help says more)")


if __name__ == "__main__":
    main()
