"""Reading ``data.path`` for ``data=files``: the user's own federated text as Arrow tables through
Hugging Face ``datasets``, offline, converted once and cached by content, never written next to
the data.

What ``data.path`` may name (:func:`resolve`):

* a ``.jsonl`` / ``.json`` file (JSON Lines, or one JSON array of objects; optionally ``.gz``), a
  ``.csv`` file (optionally ``.gz``) or a ``.parquet`` file;
* ``.txt`` files (optionally ``.gz``), one user per file: the table has the columns ``file`` (the
  user id: the file's path relative to ``data.path``, or to the glob's common directory; a single
  file's own name) and ``text`` (one row per non-empty line, as written), so a run names them
  ``data.user_column=file data.text_column=text``; a file with no non-empty line, or that is not
  UTF-8, is refused;
* a glob, or a directory (every such file under it, recursively, sorted; files of other kinds and
  hidden files are not read), of files of one format;
* a directory written by ``datasets``' ``save_to_disk``: a ``Dataset`` (``state.json``), or a
  ``DatasetDict`` (``dataset_dict.json``), whose split names act as the split column (``train``
  trained on, ``test`` evaluated, any other ignored).

Conversion (:func:`open_source`): ``datasets.load_dataset(builder, data_files=[...])`` with the
builder of the files' suffix (``json``, ``csv``, ``parquet``; ``.txt`` files through
``Dataset.from_generator``, into the same cache and never next to the data) writes Arrow files;
they are moved into a cache entry named after the *content* of the files
(``content_digest.identity``, the digest the research key covers, and for ``.txt`` the files'
relative names too, which are the user ids; ``datasets`` itself keys local files by path and
mtime), so a copy
of the same data at another path opens the same Arrow files, memory-mapped
(``Dataset.from_file``). A ``save_to_disk`` directory is opened in place (``load_from_disk``,
memory-mapped, no copy). CSV is read with every column as text (``converters=str``,
``keep_default_na=False``): pandas' defaults would turn the ids ``007``, ``NA``, ``1e5`` into
``7.0``, a missing value, ``100000.0``.

Nothing is written into the user's directory: a loaded dataset is never ``.map``-ped,
``.filter``-ed, ``.sort``-ed or ``.flatten_indices``-ed (on a ``load_from_disk`` dataset these write
``cache-*.arrow`` files into the user's ``save_to_disk`` directory); rows are read with
``dataset[list_of_positions]``, columns with ``dataset.data``. ``datasets`` is imported offline
(:func:`fedpriv.text.corpora.datasets_module`) and always given a ``cache_dir`` here.

The cache entry ``$FEDPRIV_CACHE/files/<key>/`` holds a copy of the users' text and every user id:
it is private (directories 0700, files 0600), like the StackOverflow row map. Each part of it
(``table/`` here, ``index-<columns>/`` in :mod:`fedpriv.data.files_index`) is built in a temporary directory
beside it and renamed in whole, and checked when loaded (rebuilt when anything is off).

Bad input is one :class:`~fedpriv.errors.ConfigError` line: a missing path, an unreadable or
corrupt file (``datasets``' own logger, which prints its own line for some, is silenced during the
read), a missing column (naming the columns that exist), a column of the wrong type, a user column
of mixed types (``datasets`` 5 reads a JSON column of numbers and strings as a ``Json`` feature
instead of failing), a row without a user id or with an empty text, a split column with no
``train`` row.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import glob as globbing
import gzip
import hashlib
import json
import logging
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from fedpriv.release.atomic import write_atomic
from fedpriv.cache import cache_root
from fedpriv.keys.content_digest import files_of, identity
from fedpriv.errors import ConfigError, OutputError
from fedpriv.release.rundir import short_reason
from fedpriv.text.corpora import datasets_module

FORMAT = "fedpriv-files-v2"  # the layout of a cache entry; part of its key (v2: record batches of BATCH_ROWS)
# rows per record batch of a converted table. datasets writes batches of ~1,000 rows, each with its
# own metadata: opening a memory-mapped stream reads every batch's metadata, and the kernel maps the
# pages around each read (fault-around), so a 5M-row table was resident whole (~1.2 GB) before one
# user was read. Batches of 2^18 rows keep each column contiguous: opening touches a few pages, the
# user column only its own, the text only the rows gathered.
BATCH_ROWS = 1 << 18
TRAIN, TEST = "train", "test"
SAVE_TO_DISK = "save_to_disk"
# data file suffix (after an optional .gz) -> its format; the format's datasets builder
KINDS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "txt"}
BUILDERS = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet", "txt": "txt"}
GZIP_OK = ("jsonl", "json", "csv", "txt")
DESCRIBED = {"jsonl": "JSON Lines", "json": "JSON", "csv": "CSV", "parquet": "Parquet",
             "txt": "text, one user per file", SAVE_TO_DISK: "a datasets save_to_disk directory"}
WHAT = ".jsonl, .json, .csv or .txt (optionally .gz) or .parquet"
TXT_USER, TXT_TEXT = "file", "text"  # the columns of .txt files: the user id (the file's relative path), a line
STEP = 1 << 20  # rows per slice when a pass reads a column: the only rows it holds at once
_USER_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_integer)
_TEXT_TYPES = (pa.types.is_string, pa.types.is_large_string)


@dataclass(frozen=True)
class Resolved:
    """What ``data.path`` names: its format and the files read (a ``save_to_disk`` directory is
    ``kind == "save_to_disk"`` with the directory as its one file)."""

    path: str  # as given
    kind: str  # a KINDS value, or SAVE_TO_DISK
    files: tuple[Path, ...]
    root: Path | None = None  # the directory the files' relative names start from (the user ids of .txt files)

    @property
    def builder(self) -> str | None:
        return BUILDERS.get(self.kind)


@dataclass(frozen=True, eq=False)
class FilesSource:
    """``data.path`` read: the rows a run reads, memory-mapped, with the columns checked.

    ``split`` says where the test set comes from: ``"column"`` (``split_column``: rows whose value
    is ``train`` are trained on, ``test`` evaluated, any other value or a null ignored),
    ``"dict"`` (a ``DatasetDict``: its ``train`` split is ``train``, its ``test`` split, if any, is
    ``test``), ``"users"`` (no split: whole users are held out by the public rule
    :func:`fedpriv.data.files_index.split_of`). Row positions (the index's) are positions in
    ``train``; ``test`` is the ``DatasetDict``'s test split (None otherwise)."""

    path: str
    kind: str
    files: tuple[Path, ...]
    user_column: str
    text_column: str
    split_column: str | None
    split: str  # "column" | "dict" | "users"
    train: Any  # datasets.Dataset: the rows indexed by user
    test: Any  # datasets.Dataset | None: a DatasetDict's test split
    key: str  # sha256 hex of what the converted table depends on (content, format, reader, datasets version)
    entry: Path  # the cache entry: $FEDPRIV_CACHE/files/<key[:32]>
    columns_key: str  # sha256 hex of ``key`` and the three columns: what the checks and the index depend on
    columns: tuple[tuple[str, str], ...]  # (name, type) of each column of ``train``, for a data owner's look
    converted: bool  # the conversion was done by this call (not found in the cache)

    @property
    def described(self) -> str:
        """``"chats.jsonl (JSON Lines, 1 file)"``: for messages and ``inspect``."""
        n = len(self.files)
        files = "" if self.kind == SAVE_TO_DISK else f", {n} file{'s' if n != 1 else ''}"
        return f"{self.path} ({DESCRIBED[self.kind]}{files})"


# ---------------------------------------------------------------------------------------------
# What data.path names
# ---------------------------------------------------------------------------------------------


def _kind(file: Path) -> str | None:
    suffixes = [s.lower() for s in file.suffixes]
    gz = bool(suffixes) and suffixes[-1] == ".gz"
    if gz:
        suffixes = suffixes[:-1]
    kind = KINDS.get(suffixes[-1]) if suffixes else None
    return None if kind is None or (gz and kind not in GZIP_OK) else kind


def _hidden(file: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in file.relative_to(root).parts)


def is_save_to_disk(path: Path) -> bool:
    """A directory ``datasets``' ``save_to_disk`` wrote (a ``Dataset`` or a ``DatasetDict``)."""
    return path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file())


_NO_PATH = ("data=files needs data.path: a .jsonl, .json, .csv or .parquet file, a glob or a directory of them, "
            "or a directory written by datasets' save_to_disk")


def check_named(path: str | os.PathLike | None, user_column: str | None, text_column: str | None,
                split_column: str | None = None) -> None:
    """What a ``data=files`` run must name, checked without reading anything (the config's check
    and :func:`open_source`): a path, the user and text columns, and distinct column names."""
    if path is None or not str(path).strip():
        raise ConfigError(_NO_PATH)
    for key, column in (("data.user_column", user_column), ("data.text_column", text_column)):
        if not column:
            raise ConfigError(f"data=files needs {key}: the name of the column that holds "
                              + ("each row's user id" if key == "data.user_column" else "each row's text"))
    if user_column == text_column or (split_column is not None and split_column in (user_column, text_column)):
        raise ConfigError("data.user_column, data.text_column and data.split_column must name different columns")


def resolve(path: str | os.PathLike | None) -> Resolved:
    """The format and the sorted files that ``data.path`` names (see the module docstring), or a
    :class:`ConfigError` saying what it names instead."""
    if path is None or not str(path).strip():
        raise ConfigError(_NO_PATH)
    shown = str(path)
    p = Path(shown).expanduser()
    if is_save_to_disk(p):
        return Resolved(shown, SAVE_TO_DISK, (p,), p)
    found = files_of(shown)
    if found is None:
        raise ConfigError(f"data.path {shown!r}: no such file, directory or glob match")
    root, matches = found
    if p.is_dir():
        files = [f for f in matches if not _hidden(f, root) and _kind(f) is not None]
        if not files:
            seen = sorted({"".join(f.suffixes) or f.name for f in matches if not _hidden(f, root)})
            more = f" (it holds {', '.join(seen[:5])}{', …' if len(seen) > 5 else ''})" if seen else " (it is empty)"
            raise ConfigError(f"data.path {shown!r}: no {WHAT} file in this directory{more}")
    else:
        files = matches
        bad = [f for f in files if _kind(f) is None]
        if bad:
            which = "is" if p.is_file() else f"matches {str(bad[0])!r}, which is"
            raise ConfigError(f"data.path {shown!r} {which} not a {WHAT} file")
    empty = [f for f in files if f.stat().st_size == 0]
    if empty:
        raise ConfigError(f"cannot read {str(empty[0])!r}: the file is empty")
    kinds = sorted({_kind(f) for f in files})
    builders = sorted({BUILDERS[k] for k in kinds})
    if len(builders) > 1:
        raise ConfigError(f"data.path {shown!r} mixes file formats ({', '.join(DESCRIBED[k] for k in kinds)}): "
                          "point it at the files of one format")
    return Resolved(shown, kinds[0] if len(kinds) == 1 else "json", tuple(files), root)


# ---------------------------------------------------------------------------------------------
# The cache entry
# ---------------------------------------------------------------------------------------------


def private_dir(path: Path) -> Path:
    """``path`` as an owner-only directory (created, or made 0700 where it is ours and wider)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def make_private(tree: Path) -> None:
    """Every directory under ``tree`` (itself too) 0700, every file 0600."""
    tree.chmod(0o700)
    for root, dirs, files in os.walk(tree):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o700)
        for f in files:
            os.chmod(os.path.join(root, f), 0o600)


def temporary_dir(entry: Path, part: str) -> Path:
    """A new owner-only directory beside ``entry/part``, to build it in."""
    while True:
        tmp = entry / f".{part}-{secrets.token_hex(8)}.tmp"
        try:
            tmp.mkdir(mode=0o700)
            return tmp
        except FileExistsError:
            continue


def publish_dir(tmp: Path, final: Path) -> bool:
    """Rename the built directory ``tmp`` to ``final``, replacing one found wanting there (moved
    aside and removed). False (``tmp`` removed) where another process published ``final`` first."""
    try:
        os.rename(tmp, final)
        return True
    except OSError:
        pass
    old = final.parent / f".{final.name}-{secrets.token_hex(8)}.old"
    try:
        os.rename(final, old)
    except FileNotFoundError:
        pass
    try:
        os.rename(tmp, final)
        return True
    except OSError:  # another process's, renamed in meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    finally:
        shutil.rmtree(old, ignore_errors=True)


def _entry(key: str) -> Path:
    where = cache_root() / "files" / key[:32]
    try:
        return private_dir(where)
    except OSError as err:
        raise OutputError(f"cannot write the data cache {where} ({short_reason(err)}): set FEDPRIV_CACHE to a "
                          "writable directory") from None


def _reader_options(resolved: Resolved) -> dict[str, Any]:
    """The ``load_dataset`` keyword arguments of the format (CSV: every column as text)."""
    if resolved.builder == "json":
        return {"parse_agent_traces": False}  # the columns as written, not reshaped
    if resolved.builder == "csv":
        header: list[str] = []
        for f in resolved.files:  # every column as text: no type guessed, no value read as missing
            header += [c for c in _csv_header(f) if c not in header]
        return {"converters": dict.fromkeys(header, str), "keep_default_na": False}
    return {}


def _csv_header(file: Path) -> list[str]:
    try:
        opened = (gzip.open(file, "rt", encoding="utf-8-sig", newline="") if file.suffix.lower() == ".gz"
                  else open(file, encoding="utf-8-sig", newline=""))
        with opened as fh:
            return next(csv.reader(fh), [])
    except (OSError, UnicodeDecodeError, csv.Error, EOFError) as err:
        raise ConfigError(f"cannot read {str(file)!r} as CSV ({short_reason(err)})") from None


def _key(resolved: Resolved, version: str) -> str:
    """SHA-256 over what the entry depends on: the files' content, their format and reader, and
    the ``datasets`` version that converts them (not the columns: CSV reads all of them as text)."""
    try:
        content = identity(resolved.path)
    except OSError as err:
        raise ConfigError(f"cannot read data.path {resolved.path!r} ({short_reason(err)})") from None
    if not content or content.get("missing"):
        raise ConfigError(f"data.path {resolved.path!r}: no such file, directory or glob match")
    described = {"csv": "converters=str keep_default_na=False", "json": "parse_agent_traces=False",
                 "txt": _txt_names(resolved)}  # .txt: the relative names are the user ids
    what = [FORMAT, content["sha256"], resolved.kind, described.get(resolved.builder or "", ""), version]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()


@contextlib.contextmanager
def quiet(datasets) -> Iterator[None]:
    """``datasets`` with no log line and no progress bar of its own (its errors become ours)."""
    log = logging.getLogger("datasets")
    level = log.level
    bars_off = datasets.utils.are_progress_bars_disabled()
    log.setLevel(logging.CRITICAL + 1)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        log.setLevel(level)
        if not bars_off:
            datasets.enable_progress_bars()


# ---------------------------------------------------------------------------------------------
# Conversion (files -> Arrow, once per content) and opening
# ---------------------------------------------------------------------------------------------


def _reason(err: BaseException) -> str:
    """The message of the first exception in ``err``'s chain that is not ``datasets``' wrapper."""
    seen = err
    while seen is not None and type(seen).__name__ == "DatasetGenerationError":
        seen = seen.__cause__ or seen.__context__
    return short_reason(seen if seen is not None else err)


def _txt_names(resolved: Resolved) -> list[str]:
    """The user id of each ``.txt`` file: its path relative to :attr:`Resolved.root`, with ``/``."""
    root = resolved.root if resolved.root is not None else Path(resolved.path).expanduser().parent
    return [f.relative_to(root).as_posix() for f in resolved.files]


def txt_rows(files: list[str], names: list[str]) -> Iterator[dict[str, str]]:
    """The rows of ``.txt`` files (optionally gzipped): ``{"file": name, "text": line}`` per
    non-empty line (its line break dropped, nothing else changed), file by file in order. A file
    that is not UTF-8 text or has no non-empty line is a :class:`ConfigError` saying so (the caller
    names the file: :func:`_conversion_error`)."""
    for file, name in zip(files, names):
        rows = 0
        try:
            with (gzip.open(file, "rt", encoding="utf-8") if file.lower().endswith(".gz")
                  else open(file, encoding="utf-8")) as fh:
                for line in fh:
                    text = line.rstrip("\r\n")
                    if text.strip():
                        rows += 1
                        yield {TXT_USER: name, TXT_TEXT: text}
        except UnicodeDecodeError:
            raise ConfigError("it is not UTF-8 text") from None
        except (OSError, EOFError) as err:
            raise ConfigError(short_reason(err)) from None
        if not rows:
            raise ConfigError("it has no non-empty line (a user's file needs text: one row per line)")


def _convert_into(datasets, resolved: Resolved, files: list[Path], options: dict, cache_dir: Path):
    if resolved.kind == "txt":  # one user per file: written into cache_dir by a generator (our cache only)
        every = dict(zip(resolved.files, _txt_names(resolved)))
        names = [every[f] for f in files]
        features = datasets.Features({TXT_USER: datasets.Value("string"), TXT_TEXT: datasets.Value("string")})
        fingerprint = hashlib.sha256(json.dumps([str(f) for f in files] + names).encode()).hexdigest()[:32]
        return datasets.Dataset.from_generator(txt_rows, features=features, cache_dir=str(cache_dir),
                                               gen_kwargs={"files": [str(f) for f in files], "names": names},
                                               fingerprint=fingerprint)
    # escaped: datasets reads each name as a glob pattern ("rows[1].jsonl" would match nothing)
    return datasets.load_dataset(resolved.builder, data_files=[globbing.escape(str(f)) for f in files],
                                 split="train", cache_dir=str(cache_dir), **options)


def _conversion_error(datasets, resolved: Resolved, options: dict, tmp: Path, err: Exception) -> ConfigError:
    """A one-line error naming the file that does not read (each file alone, where there are several)."""
    what = DESCRIBED[resolved.kind]
    if len(resolved.files) == 1:
        return ConfigError(f"cannot read {str(resolved.files[0])!r} as {what}: {_reason(err)}")
    for n, f in enumerate(resolved.files):
        try:
            _convert_into(datasets, resolved, [f], options, tmp / f"probe-{n}")
        except Exception as single:  # noqa: BLE001 - any failure to read the user's file is bad input
            return ConfigError(f"cannot read {str(f)!r} as {what}: {_reason(single)}")
        finally:
            shutil.rmtree(tmp / f"probe-{n}", ignore_errors=True)
    return ConfigError(f"the files of data.path {resolved.path!r} do not read as one table (do they all have the "
                       f"same columns, of the same types?): {_reason(err)}")


def _open_table(datasets, table_dir: Path, key: str):
    """The converted dataset in ``table_dir`` (memory-mapped), or None if it is missing or off."""
    try:
        manifest = json.loads((table_dir / "manifest.json").read_text())
        if manifest.get("format") != FORMAT or manifest.get("key") != key:
            return None
        names, rows = manifest["files"], manifest["rows"]
        if not (isinstance(names, list) and names and isinstance(rows, int)):
            return None
        if any(not isinstance(n, str) or "/" in n or n.startswith(".") for n in names):
            return None
        parts = [datasets.Dataset.from_file(str(table_dir / n)) for n in names]
        ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    except Exception:  # noqa: BLE001 - a missing, truncated or foreign entry: convert again
        return None
    return ds if len(ds) == rows and ds.data.num_rows == rows else None


def _rebatch(source: Path, target: Path, rows: int | None = None) -> None:
    """Rewrite the Arrow stream ``source`` as ``target`` in record batches of ``rows`` rows (the
    last shorter), rows and schema unchanged (:data:`BATCH_ROWS` says why); at most one batch is
    held in memory (``rows`` None: :data:`BATCH_ROWS`). ``source`` is removed."""
    rows = BATCH_ROWS if rows is None else rows
    with pa.memory_map(str(source)) as mapped:
        reader = pa.ipc.open_stream(mapped)
        with pa.OSFile(str(target), "wb") as sink, pa.ipc.new_stream(sink, reader.schema) as writer:
            held: list[pa.RecordBatch] = []
            count = 0
            for batch in reader:
                held.append(batch)
                count += batch.num_rows
                while count >= rows:
                    table = pa.Table.from_batches(held, reader.schema)
                    writer.write_table(table.slice(0, rows).combine_chunks(), max_chunksize=rows)
                    rest = table.slice(rows)
                    held, count = rest.to_batches(), rest.num_rows
            if count:
                writer.write_table(pa.Table.from_batches(held, reader.schema).combine_chunks(), max_chunksize=rows)
    source.unlink()


def _converted(datasets, resolved: Resolved, entry: Path, key: str) -> tuple[Any, bool]:
    """The files as one memory-mapped dataset: from the entry, else converted into it."""
    table_dir = entry / "table"
    ds = _open_table(datasets, table_dir, key)
    if ds is not None:
        return ds, False
    options = _reader_options(resolved)
    tmp = temporary_dir(entry, "table")
    try:
        try:
            ds = _convert_into(datasets, resolved, list(resolved.files), options, tmp / "hf")
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise OutputError(f"cannot write the data cache {entry} ({short_reason(err)})") from None
            raise _conversion_error(datasets, resolved, options, tmp, err) from None
        except Exception as err:  # noqa: BLE001 - any failure to read the user's files is bad input
            raise _conversion_error(datasets, resolved, options, tmp, err) from None
        if len(ds) == 0:
            raise ConfigError(f"{resolved.path!r} has no rows")
        names = []
        for n, cached in enumerate(ds.cache_files):
            name = f"part-{n:05d}.arrow"
            _rebatch(Path(cached["filename"]), tmp / name)
            names.append(name)
        rows = len(ds)
        del ds
        shutil.rmtree(tmp / "hf")
        write_atomic(tmp / "manifest.json", json.dumps({"format": FORMAT, "key": key, "files": names,
                                                        "rows": rows}).encode(), private=True)
        make_private(tmp)
        publish_dir(tmp, table_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ds = _open_table(datasets, table_dir, key)
    if ds is None:
        raise OutputError(f"the data cache {table_dir} was written but does not read back")
    return ds, True


def _from_disk(datasets, resolved: Resolved):
    try:
        return datasets.load_from_disk(str(resolved.files[0]))
    except Exception as err:  # noqa: BLE001 - any failure to read the user's directory is bad input
        raise ConfigError(f"cannot read {resolved.path!r} as {DESCRIBED[SAVE_TO_DISK]}: {_reason(err)}") from None


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------


def _type_name(ds, column: str) -> str:
    feature = ds.features[column]
    if type(feature).__name__ == "Json":
        return "mixed (JSON)"
    return str(ds.data.schema.field(column).type)


def _check_columns(ds, where: str, user: str, text: str, split: str | None) -> None:
    names = list(ds.column_names)
    for key, column in (("data.user_column", user), ("data.text_column", text), ("data.split_column", split)):
        if column is not None and column not in names:
            raise ConfigError(f"{key}={column!r} is not a column of {where} (its columns: {', '.join(names)})")
    for key, column, kinds, what in (("data.user_column", user, _USER_TYPES, "user ids (strings or integers)"),
                                     ("data.text_column", text, _TEXT_TYPES, "text (strings)"),
                                     ("data.split_column", split, _TEXT_TYPES, "split names (strings)")):
        if column is None:
            continue
        feature = ds.features[column]
        if type(feature).__name__ == "Json":
            raise ConfigError(f"{key}={column!r} of {where} mixes value types (say numbers and strings): it must "
                              f"hold {what} of one type in every row")
        kind = ds.data.schema.field(column).type
        if not any(ok(kind) for ok in kinds):
            raise ConfigError(f"{key}={column!r} of {where} holds {kind} values, not {what}")


def column_slices(ds, column: str) -> Iterator[tuple[int, pa.Array]]:
    """(first row, the column's values) per slice of :data:`STEP` rows of the dataset ``ds``: how a
    pass reads a column (one slice in memory; never the text of other columns)."""
    values = ds.data.table.column(column)
    for start in range(0, ds.data.num_rows, STEP):
        chunk = values.slice(start, STEP)
        yield start, (chunk.combine_chunks() if chunk.num_chunks != 1 else chunk.chunk(0))


def _first(mask: pa.Array) -> tuple[int, int]:
    """(how many are true, the position of the first true) in a boolean array without nulls."""
    count = pc.sum(mask).as_py() or 0
    return count, (pc.index(mask, True).as_py() if count else -1)


def _check_rows(ds, where: str, user: str, text: str, split: str | None) -> None:
    """Every read row has a user id and a non-blank text; a split column has ``train`` rows. One
    pass over the columns, :data:`STEP` rows at a time."""
    if ds.data.num_rows == 0:
        raise ConfigError(f"{where} has no rows")
    string_ids = pa.types.is_string(ds.data.schema.field(user).type) or pa.types.is_large_string(
        ds.data.schema.field(user).type)
    splits = column_slices(ds, split) if split is not None else None
    train = 0
    values: set[str] = set()
    for (start, ids), (_, texts) in zip(column_slices(ds, user), column_slices(ds, text)):
        read = None
        if splits is not None:
            _, names = next(splits)
            is_train = pc.fill_null(pc.equal(names, TRAIN), False)
            train += pc.sum(is_train).as_py() or 0
            read = pc.or_(is_train, pc.fill_null(pc.equal(names, TEST), False))
            if len(values) < 6:
                values |= {v for v in pc.unique(names).to_pylist()[:6] if v is not None}
        no_id = pc.is_null(ids)
        if string_ids:
            no_id = pc.or_(no_id, pc.fill_null(pc.equal(pc.utf8_length(ids), 0), False))
        blank = pc.fill_null(pc.or_(pc.equal(pc.utf8_length(texts), 0), pc.utf8_is_space(texts)), True)
        or_empty = " or empty" if string_ids else ""
        for mask, what in ((no_id, f"no user id (data.user_column {user!r} is null{or_empty})"),
                           (blank, f"an empty text (data.text_column {text!r} is null, empty or blank)")):
            if read is not None:
                mask = pc.and_(mask, read)
            count, first = _first(mask)
            if count:
                raise ConfigError(f"row {start + first + 1} of {where} has {what}: every row read needs a user id "
                                  "and a text")
    if split is not None and train == 0:
        shown = ", ".join(repr(v) for v in sorted(values)[:5]) or "only nulls"
        raise ConfigError(f"no row of {where} has data.split_column {split!r} = 'train' (its values: {shown}): "
                          "rows whose value is 'train' are trained on, 'test' evaluated, any other ignored")


def _checked_before(marker: Path, key: str) -> bool:
    try:
        return json.loads(marker.read_text()) == {"format": FORMAT, "key": key}
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------
# The one entry point
# ---------------------------------------------------------------------------------------------


def open_source(path: str | os.PathLike, user_column: str, text_column: str,
                split_column: str | None = None) -> FilesSource:
    """Read ``path`` (see the module docstring): resolve it, convert it once (cached by content)
    or open a ``save_to_disk`` directory in place, and check the columns and rows (the row checks,
    one pass, are recorded in the entry and not repeated for the same content and columns). Bad
    input is one :class:`ConfigError` line; an unwritable cache one :class:`OutputError` line."""
    check_named(path, user_column, text_column, split_column)
    resolved = resolve(path)
    datasets = datasets_module()
    key = _key(resolved, datasets.__version__)
    entry = _entry(key)
    try:
        return _open(datasets, resolved, entry, key, user_column, text_column, split_column)
    except ConfigError:
        with contextlib.suppress(OSError):
            entry.rmdir()  # only where nothing was kept in it
        raise


def _open(datasets, resolved: Resolved, entry: Path, key: str, user_column: str, text_column: str,
          split_column: str | None) -> FilesSource:
    where = resolved.path
    converted = False
    with quiet(datasets):
        if resolved.kind == SAVE_TO_DISK:
            loaded = _from_disk(datasets, resolved)
        else:
            loaded, converted = _converted(datasets, resolved, entry, key)
    if isinstance(loaded, datasets.DatasetDict):
        if split_column is not None:
            raise ConfigError(f"data.split_column cannot be used with {where!r}: it is a DatasetDict, whose splits "
                              f"({', '.join(loaded)}) are the split")
        if TRAIN not in loaded:
            raise ConfigError(f"{where!r} is a DatasetDict without a 'train' split (its splits: "
                              f"{', '.join(loaded)}): its 'train' split is trained on, 'test' evaluated")
        parts = {TRAIN: loaded[TRAIN], **({TEST: loaded[TEST]} if TEST in loaded else {})}
        split = "dict"
    else:
        parts = {TRAIN: loaded}
        split = "column" if split_column is not None else "users"
    for name, ds in parts.items():
        label = f"{where!r}" + (f" (split {name!r})" if split == "dict" else "")
        if ds.data.num_rows != len(ds):  # an indices mapping: positions would not be rows
            raise ConfigError(f"{label} is a view of another table (an indices mapping): save it with "
                              "save_to_disk, which writes its rows")
        _check_columns(ds, label, user_column, text_column, split_column)
    if len({pa.types.is_integer(ds.data.schema.field(user_column).type) for ds in parts.values()}) > 1:
        raise ConfigError(f"data.user_column {user_column!r} of {where!r} holds integers in one split and strings "
                          "in the other: a user id must have one type")
    columns_key = hashlib.sha256(json.dumps([key, user_column, text_column, split_column]).encode()).hexdigest()
    marker = entry / f"checked-{columns_key[:16]}.json"
    if not _checked_before(marker, columns_key):
        for name, ds in parts.items():
            label = f"{where!r}" + (f" (split {name!r})" if split == "dict" else "")
            _check_rows(ds, label, user_column, text_column, split_column)
        try:
            write_atomic(marker, json.dumps({"format": FORMAT, "key": columns_key}).encode(), private=True)
        except OutputError:  # checked again next time
            pass
    train = parts[TRAIN]
    columns = tuple((name, _type_name(train, name)) for name in train.column_names)
    return FilesSource(path=where, kind=resolved.kind, files=resolved.files, user_column=user_column,
                       text_column=text_column, split_column=split_column, split=split, train=train,
                       test=parts.get(TEST), key=key, entry=entry, columns_key=columns_key, columns=columns,
                       converted=converted)
