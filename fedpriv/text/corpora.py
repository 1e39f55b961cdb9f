"""Public text corpora (no privacy cost): C4 ``realnewslike`` through ``datasets`` and local
text/JSON files, split into sentences and normalized the way TFF's StackOverflow tokens are
(lower case, punctuation as separate tokens, words separated by single spaces).

* ``c4``: ``datasets.load_dataset("json", data_files=..., streaming=True)`` over local
  ``c4-train.*.json.gz`` shards (the layout of ``allenai/c4`` ``realnewslike``: one JSON object
  per line with a ``text`` field). A path is required: nothing is ever downloaded (the config
  check refuses ``public_source=c4`` without ``public_path`` before anything is written).
* ``text``: local ``.txt`` files (one document per line) or ``.jsonl``/``.json`` files (one
  object per line, text under ``text_field``), optionally gzipped; a directory means every such
  file in it, sorted.

Documents are read in order until ``max_sentences`` sentences are collected, so the corpus is
deterministic for fixed files.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from fedpriv.cache import cache_root
from fedpriv.errors import ConfigError
from fedpriv.release.rundir import short_reason
from fedpriv.schema.sections import missing_path_message

TEXT_SUFFIXES = (".txt", ".jsonl", ".json")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")


def normalize(sentence: str) -> str:
    """Lower case; words (with an English clitic such as ``'s``) and single punctuation marks
    become space-separated tokens: ``"It's 5 p.m."`` → ``"it's 5 p . m ."``."""
    return " ".join(_TOKEN.findall(sentence.lower()))


def sentences(document: str) -> list[str]:
    """The normalized, non-empty sentences of ``document`` (split after . ! ? and at newlines)."""
    return [s for s in (normalize(part) for part in _SENTENCE_END.split(document)) if s]


def _files(path: str | Path) -> list[Path]:
    root = Path(path)
    if root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and _suffix(p) in TEXT_SUFFIXES)
    elif root.is_file():
        files = [root]
    else:
        files = sorted(Path(p) for p in root.parent.glob(root.name)) if any(c in root.name for c in "*?[") else []
    if not files:
        raise ConfigError(f"no public text files at {str(path)!r} (expected .txt, .jsonl or .json, optionally .gz)")
    return files


def _suffix(path: Path) -> str:
    suffixes = [s for s in path.suffixes if s != ".gz"]
    return suffixes[-1] if suffixes else ""


def _open(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")


def _documents_from_files(path: str | Path, text_field: str) -> Iterator[str]:
    for file in _files(path):
        kind = _suffix(file)
        try:
            with _open(file) as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    if kind == ".txt":
                        yield line
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise ConfigError(f"{file}:{n}: not a JSON object per line ({err.msg})") from None
                    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                        raise ConfigError(f"{file}:{n}: no string field {text_field!r}")
                    yield record[text_field]
        except UnicodeDecodeError:
            raise ConfigError(f"{file}: not UTF-8 text") from None
        except (OSError, EOFError) as err:  # unreadable, or a damaged .gz
            raise ConfigError(f"cannot read {file} ({short_reason(err)})") from None


def public_word_counts(path: str | Path, text_field: str = "text") -> Counter[str]:
    """How often each word occurs in the normalised sentences (:func:`sentences`) of the local
    public text at ``path`` (what ``public_source=text`` reads: ``.txt`` files, one document per
    line, or ``.jsonl``/``.json`` with a ``text_field``, optionally gzipped; a directory or a glob of
    them), all of it: the words ``data=files``' ``preprocess=tff`` makes of the same text."""
    counts: Counter[str] = Counter()
    for doc in _documents_from_files(path, text_field):
        for sentence in sentences(doc):
            counts.update(sentence.split())
    if not counts:
        raise ConfigError(f"the public text at {str(path)!r} has no sentences")
    return counts


def datasets_module():
    """Hugging Face ``datasets``, imported offline: ``HF_DATASETS_OFFLINE`` and ``HF_HUB_OFFLINE`` are
    set to 1 and ``HF_HOME`` (unless set) to ``$FEDPRIV_CACHE/hf`` before the import (``datasets``
    reads them once, at import), and its offline flag is set after it too (where it was imported
    before). Readers still pass their own ``cache_dir``: nothing is downloaded, nothing is written
    under the user's home."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("HF_HOME", str(cache_root() / "hf"))
    import datasets  # lazy: ~1.3 s to import, the readers that use it only
    import huggingface_hub.constants  # lazy: comes with datasets

    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    return datasets


def _documents_from_c4(path: str | Path | None) -> Iterator[str]:
    """The ``text`` of each record of local C4 shards, read with ``datasets``' local JSON builder
    (never the hub: without a path this is a :class:`ConfigError`)."""
    if not path:
        raise ConfigError(missing_path_message("c4"))
    files = [str(f) for f in _files(path)]
    stream = datasets_module().load_dataset("json", data_files=files, split="train", streaming=True)
    for record in stream:
        yield record["text"]


def public_texts(source: str, path: str | Path | None, max_sentences: int, text_field: str = "text") -> list[str]:
    """The first ``max_sentences`` normalized sentences of a public ``source`` (``c4`` or ``text``)."""
    if source not in ("c4", "text"):
        raise ConfigError(f"unknown public text source {source!r} (choose one of: c4, text)")
    if max_sentences < 1:
        raise ConfigError(f"the public corpus needs max_sentences >= 1, got {max_sentences}")
    if not path:
        raise ConfigError(missing_path_message(source))
    docs = _documents_from_c4(path) if source == "c4" else _documents_from_files(path, text_field)
    out: list[str] = []
    for doc in docs:
        out += sentences(doc)
        if len(out) >= max_sentences:
            break
    if not out:
        raise ConfigError(f"the public corpus at {str(path)!r} has no sentences")
    return out[:max_sentences]
