"""``python -m fedpriv.data.prepare_stackoverflow SRC [DST]``: an indexed copy of TFF's
``stackoverflow.sqlite`` (the loader reads a user with an index lookup instead of a full-table
scan; see :mod:`fedpriv.data.stackoverflow`).

SRC must have TFF's schema (checked by the loader's own check). DST (default: ``SRC``'s name with
``.indexed`` before the suffix, beside it) is written with Python's ``sqlite3`` module only: an
online backup of SRC into a temporary file in DST's directory, then the index
``examples_client ON examples(client_id, split_name)``, then a hard link to DST (never replacing
a file); a failure or Ctrl-C leaves no DST. ``--in-place`` adds the index to SRC itself instead
(one transaction: SRC is unchanged if it fails). SRC is otherwise only read; if it already has an
index the loader uses, nothing is written. It prints what it did and the ``fedpriv.simulate``
command to run next. Bad input (SRC missing, not a file, not TFF's schema; DST existing): one
``error: ...`` line, exit 2; a failed write (a full disk): one ``error: ...`` line, exit 1.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sqlite3
import stat
import sys
import time
from contextlib import closing
from pathlib import Path

from fedpriv.release.atomic import create_atomic
from fedpriv.release.console import OneLineParser, fail
from fedpriv.data.stackoverflow import _check_schema, _connect, _has_client_index
from fedpriv.errors import ConfigError

INDEX_NAME = "examples_client"  # what fedpriv.data.stackoverflow_writer writes; any index that starts
INDEX_SQL = f"CREATE INDEX {INDEX_NAME} ON examples (client_id, split_name)"  # with client_id serves the loader


def default_destination(src: Path) -> Path:
    """``stackoverflow.sqlite`` -> ``stackoverflow.indexed.sqlite`` beside it."""
    return src.with_name(f"{src.stem}.indexed{src.suffix or '.sqlite'}")


def _check_source(src: Path) -> bool:
    """Refuse anything but a file with TFF's schema; True if it already has a client index."""
    if not src.exists():
        raise ConfigError(f"{src} does not exist: pass TFF's stackoverflow.sqlite (decompressed from "
                          "stackoverflow.sqlite.lzma)")
    if not src.is_file():
        raise ConfigError(f"{src} is not a file: pass TFF's stackoverflow.sqlite itself")
    with closing(_connect(src)) as conn:
        _check_schema(conn, src)
        try:
            return _has_client_index(conn)
        except sqlite3.DatabaseError as err:
            raise ConfigError(f"cannot read {src} ({err}): expected TFF's stackoverflow.sqlite") from None


def _check_destination(src: Path, dst: Path) -> None:
    if dst.resolve() == src.resolve():
        raise ConfigError(f"the destination {dst} is the source: use --in-place to index {src} itself")
    if dst.exists() or dst.is_symlink():
        raise ConfigError(f"{dst} already exists: remove it or pass another destination")
    if not dst.parent.is_dir():
        raise ConfigError(f"the destination's directory {dst.parent} does not exist")


def index_copy(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` with the index, atomically (:func:`fedpriv.release.atomic.create_atomic`:
    a temporary file in ``dst``'s directory, published as ``dst`` once complete and synced, never
    replacing a ``dst`` that appeared meanwhile; removed on any failure)."""

    def fill(tmp: Path) -> None:
        try:
            os.chmod(tmp, stat.S_IMODE(os.stat(src).st_mode) | stat.S_IWUSR)  # the source's permissions
            with closing(_connect(src)) as source, closing(sqlite3.connect(tmp)) as target:
                source.backup(target)
                with target:  # one transaction
                    target.execute(INDEX_SQL)
        finally:
            Path(f"{tmp}-journal").unlink(missing_ok=True)

    create_atomic(dst, fill)


def index_in_place(src: Path) -> None:
    """Add the index to ``src`` itself (one transaction: on failure ``src`` is as it was)."""
    with closing(sqlite3.connect(src)) as conn, conn:
        conn.execute(INDEX_SQL)


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m fedpriv.data.prepare_stackoverflow",
                           description="Make an indexed copy of TFF's stackoverflow.sqlite for fedpriv's loader.")
    parser.add_argument("src", type=Path, help="TFF's stackoverflow.sqlite")
    parser.add_argument("dst", type=Path, nargs="?", default=None,
                        help="the indexed copy (default: SRC's name with .indexed, beside it)")
    parser.add_argument("--in-place", action="store_true", help="add the index to SRC instead of copying it")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    src: Path = args.src
    if args.in_place and args.dst is not None:
        fail("--in-place indexes SRC itself: pass no destination")
    dst: Path = src if args.in_place else (args.dst or default_destination(src))
    start = time.monotonic()
    try:
        if _check_source(src):
            print(f"{src} already has an index on examples(client_id): nothing to do, it is ready as it is")
            _print_next(src)
            return
        if not args.in_place:
            _check_destination(src, dst)
    except ConfigError as err:
        fail(str(err))
    try:
        if args.in_place:
            print(f"indexing {src} in place (minutes for the full file) ...", flush=True)
            index_in_place(src)
        else:
            print(f"copying {src} to {dst} and indexing the copy (minutes for the full file) ...", flush=True)
            index_copy(src, dst)
    except FileExistsError:
        fail(f"{dst} appeared while it was being written: it is left as it is; remove it or pass another destination")
    except (OSError, sqlite3.Error) as err:  # a full disk, a read-only file: not bad input
        print(f"error: cannot {'index ' + str(src) if args.in_place else 'write ' + str(dst)}: "
              f"{' '.join(str(err).split())}; {'it is unchanged' if args.in_place else 'nothing was written'}",
              file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"error: interrupted; {'it is unchanged' if args.in_place else 'nothing was written'}", file=sys.stderr)
        sys.exit(130)
    print(f"{'indexed' if args.in_place else 'wrote'} {dst}: index {INDEX_NAME} on examples(client_id, split_name) "
          f"({time.monotonic() - start:.1f} s)")
    _print_next(dst)


def _print_next(path: Path) -> None:
    where = shlex.quote(str(path.resolve()))
    print(f"next:\n  .venv/bin/python -m fedpriv.simulate +experiment=stackoverflow data.path={where}")


if __name__ == "__main__":
    main()
