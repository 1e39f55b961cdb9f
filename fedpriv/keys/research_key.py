"""What a research-mode run key covers: the canonical form of a run's config.

The key is ``SHA-256(tag ‖ canonical JSON)`` (:func:`research_key`). The canonical form
(:func:`canonical_config`) is built from the typed config (:class:`fedpriv.schema.RunConfig`) and
keeps exactly the values that change what the run computes:

* a field marked ``schema.PRESENTATION`` (backend, progress, run_dir, an execution path equal to
  the reference one, ...) is left out, and so are a section's :meth:`~fedpriv.schema.Section.inert_fields`
  (an audit that inserts no canaries);
* a field at its default is left out — the defaults of its section's class, or for an option of a
  group (``mechanism=bandmf``) the option's registered preset; the option's ``name`` is kept unless
  it is the group's default option. Adding a defaulted field to a section therefore changes no key,
  no golden and no resume;
* a field marked ``schema.LOCATION`` enters as the identity of the input it names (size and
  SHA-256, :func:`fedpriv.keys.content_digest.identity`), never as its path: the same data file at two
  paths gives the same research run. An input read although its field is unset (the vocabulary
  beside a data file, :meth:`~fedpriv.schema.Section.implied_locations`) enters the same way;
* integers given to float fields are floats (``lr=2`` and ``lr=2.0`` are one run).

``privacy.research_key=seed`` (paired experiments) keys the run by its seed alone: runs of one seed
share cohorts, noise and client draws whatever else differs, so two optimizers or mechanisms can be
compared on the same randomness. Such runs must never be released (research mode only; refused in
secure mode by the schema).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from collections.abc import Mapping
from typing import Any

from fedpriv import schema
from fedpriv.keys.content_digest import identity
from fedpriv.keys.randomness import RESEARCH, ClientRandomness, NoiseStream, RunRandomness

CONFIG_TAG = b"fedpriv research run key v2\x00"
PAIRED_TAG = b"fedpriv paired research key v1\x00"


def _floaty(tp: Any) -> bool:
    """Whether annotation ``tp`` admits a float but not an int (an int given there is a float)."""
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    return float in args and int not in args


def _canonical(section: Any, base: Any, root: Mapping[str, Any], default_name: str | None = None) -> dict:
    """The fields of ``section`` that differ from ``base`` (its defaults), recursively."""
    out: dict[str, Any] = {}
    inert = set(section.inert_fields())
    implied = section.implied_locations()
    hints = typing.get_type_hints(type(section))
    names = [(f.name, f.metadata) for f in dataclasses.fields(section)]
    names += [(name, {}) for name in schema.SECTIONS.get(type(section), {})]
    for name, meta in names:
        if meta.get("presentation") or name in inert:
            continue
        value = implied.get(name, schema.lookup(getattr(section, name, None), root))
        if isinstance(section, schema.RunConfig) and name in schema.GROUPS:
            preset = schema.option_preset(name, value.name)
            default = schema.option_preset(name, schema.DEFAULT_OPTIONS[name])
            sub = _canonical(value, preset, root, default_name=default.name)
        elif dataclasses.is_dataclass(value):
            sub = _canonical(value, type(value)(), root)  # a section: its class's defaults
        else:
            if name == "name" and default_name is not None:
                default_value = default_name
            else:
                default_value = schema.lookup(getattr(base, name, None), root)
            if value == default_value and (type(value) is type(default_value) or _floaty(hints.get(name))):
                continue
            if meta.get("location"):
                value = identity(value)
            elif isinstance(value, int) and not isinstance(value, bool) and _floaty(hints.get(name)):
                value = float(value)
            out[name] = value
            continue
        if sub:
            out[name] = sub
    return out


def _typed(cfg: Mapping[str, Any]) -> schema.RunConfig:
    """``cfg`` (plain, possibly partial) parsed: a value the schema refuses raises ConfigError."""
    return schema.parse(json.loads(json.dumps(dict(cfg), default=str)))


def canonical_config(cfg: Mapping[str, Any]) -> dict:
    """What the research key covers (the module docstring): a plain, JSON-able dict. ``cfg`` may
    be partial (missing keys take their defaults); a value the schema refuses raises ConfigError."""
    typed = _typed(cfg)
    return _canonical(typed, schema.RunConfig(), schema.as_dict(typed))


def _paired(typed: schema.RunConfig) -> bool:
    """Whether the run asks for paired randomness (``privacy.research_key=seed``)."""
    return typed.privacy.research_key == "seed"


def _as_typed(cfg: Mapping[str, Any] | schema.RunConfig) -> schema.RunConfig:
    """A run's typed config as it is, a plain one parsed (:func:`_typed`)."""
    return cfg if isinstance(cfg, schema.RunConfig) else _typed(cfg)


def research_key(cfg: Mapping[str, Any] | schema.RunConfig) -> bytes:
    """The research-mode run key of a resolved config (typed, or plain: parsed): its canonical
    form's digest, or the seed's alone under ``privacy.research_key=seed``."""
    return _key(_as_typed(cfg))


def _key(typed: schema.RunConfig) -> bytes:
    """``SHA-256(tag ‖ canonical JSON)`` of a parsed config, or of its seed alone when paired."""
    if _paired(typed):
        return hashlib.sha256(PAIRED_TAG + json.dumps({"seed": typed.seed}).encode()).digest()
    text = json.dumps(_canonical(typed, schema.RunConfig(), schema.as_dict(typed)), sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha256(CONFIG_TAG + text.encode()).digest()


def key_from_seed(seed: int) -> bytes:
    """A research key from a bare integer seed (tests, scripts, calculators)."""
    return research_key({"seed": int(seed)})


def noise_from_seed(seed: int) -> NoiseStream:
    """The mechanism's research noise stream of a bare integer seed (tests and scripts)."""
    return RunRandomness(key_from_seed(seed), RESEARCH).noise()


def clients_from_seed(seed: int) -> ClientRandomness:
    """Clients' research randomness of a bare integer seed (tests and scripts)."""
    return ClientRandomness(key_from_seed(seed))


def _secure(cfg: Mapping[str, Any] | schema.RunConfig) -> bool:
    """Secure mode of a typed config, or of a plain one (:func:`fedpriv.schema.resolve_secure`)."""
    return cfg.secure if isinstance(cfg, schema.RunConfig) else schema.resolve_secure(cfg)


def run_randomness(cfg: Mapping[str, Any] | schema.RunConfig) -> RunRandomness:
    """The run's key: secure mode, a fresh key from the OS CSPRNG; research mode, the key derived
    from ``cfg`` (typed, or plain: parsed; paired: from its seed alone)."""
    if _secure(cfg):
        return RunRandomness.fresh()
    typed = _as_typed(cfg)
    return RunRandomness(_key(typed), RESEARCH, paired=_paired(typed))


def client_randomness(cfg: Mapping[str, Any] | schema.RunConfig) -> ClientRandomness:
    """Where clients' draws come from under ``cfg`` (typed or plain): OS entropy (secure) or its
    research key."""
    return ClientRandomness(None if _secure(cfg) else research_key(cfg))
