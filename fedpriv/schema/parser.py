"""From a composed config (a plain dict) to the typed :class:`~fedpriv.schema.run_config.RunConfig`
and back, strictly (no coercion; the first problem is one ``ConfigError`` line), and the Hydra
ConfigStore registration of every option."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

from fedpriv.errors import ConfigError
from fedpriv.schema.checks import _fail, _key
from fedpriv.schema.registry import (DEFAULT_OPTIONS, GROUPS, SECTIONS, _import_section_plugins, option_class,
                                     option_preset, options)
from fedpriv.schema.run_config import RunConfig
from fedpriv.schema.sections import Option, Section, meanings


# --- parsing ---------------------------------------------------------------------------------------

# scalar annotation -> (what a value must be, the test it must pass); no coercion anywhere
_SCALARS: dict[Any, tuple[str, Any]] = {
    bool: ("true or false", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
            and not (isinstance(v, float) and math.isnan(v))),
    str: ("a string", lambda v: isinstance(v, str)),
}


def _type_name(tp: Any) -> str:
    if tp in _SCALARS:
        return _SCALARS[tp][0]
    if typing.get_origin(tp) is Literal:
        return "one of: " + ", ".join(str(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return "a list like [a,b]"
    return getattr(tp, "__name__", str(tp))


def _value(value: Any, tp: Any, path: str) -> Any:
    """``value`` checked against the annotation ``tp`` (no coercion; dataclasses parsed)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _value(value, arg, path)
            except ConfigError as err:
                errors.append(err)
        names = [_type_name(a) for a in args if a is not type(None)] + (["null"] if type(None) in args else [])
        raise ConfigError(f"{path} must be {' or '.join(names)}, got {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp) or isinstance(value, bool):
            raise ConfigError(f"unknown {path} {value!r} (choose one of: "
                              f"{', '.join(str(a) for a in typing.get_args(tp))})")
        return value
    if tp in _SCALARS:
        what, ok = _SCALARS[tp]
        if not ok(value):
            _fail(path, what, value)
        return value
    if tp is Any:
        return value
    if origin is list:  # list[str] and the like: a list whose every item is checked
        if not isinstance(value, list):
            _fail(path, _type_name(tp), value)
        return [_value(item, typing.get_args(tp)[0], f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _section(value, tp, path)
    raise TypeError(f"schema: unsupported annotation {tp!r} at {path}")


def unknown_key(path: str, key: str, known: list[str]) -> ConfigError:
    """The error for an unknown ``key`` under ``path``, naming the closest of the ``known`` keys."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" (did you mean '{_key(path, close[0])}'?)" if close else ""
    return ConfigError(f"unknown config key '{_key(path, key)}'{hint}")


def _fields(cls: type) -> tuple[list[str], dict[str, Any]]:
    """A section's keys and their annotations: its dataclass fields, then the sections other
    modules registered under it (:func:`register_section`)."""
    _import_section_plugins()
    hints = dict(typing.get_type_hints(cls))
    names = [f.name for f in dataclasses.fields(cls)]
    for name, sub in SECTIONS.get(cls, {}).items():
        names.append(name)
        hints[name] = sub
    return names, hints


def _section(data: Any, cls: type, path: str, base: Any = None) -> Any:
    """``data`` parsed as section ``cls``; missing keys take ``base``'s values (a group option's
    registered preset) or the class defaults."""
    if not isinstance(data, dict):
        _fail(path or "the config", "a mapping", data)
    names, hints = _fields(cls)
    for key in data:
        if key not in names:
            raise unknown_key(path, str(key), names)
    kwargs, extra = {}, {}
    own = {f.name for f in dataclasses.fields(cls)}
    for name in names:
        sub = _key(path, name)
        if name not in data:
            if name not in own:
                extra[name] = hints[name]()  # a registered section's defaults
            continue  # its default
        tp = hints[name]
        if name in GROUPS and cls is RunConfig:  # a group: the option its `name` selects
            kwargs[name] = _option(name, data[name], sub)
            continue
        (kwargs if name in own else extra)[name] = _value(data[name], tp, sub)
    section = dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    for name, value in extra.items():
        setattr(section, name, value)
    section.check(path)
    return section


def _option(group: str, data: Any, path: str) -> Option:
    """The option of ``group`` that ``data["name"]`` selects, its missing keys from its preset."""
    if not isinstance(data, dict):
        _fail(path, "a mapping", data)
    name = data.get("name", DEFAULT_OPTIONS.get(group))  # a partial mapping: the group's default option
    return _section(dict(data), option_class(group, name, path), path, option_preset(group, name))


def parse(plain: dict) -> RunConfig:
    """The typed, validated view of a composed config (``ConfigError`` on the first problem)."""
    return _section(_renamed(plain), RunConfig, "")


# top-level sections whose keys moved into a group's option, still read for a release
# (docs/SECURE_AGGREGATION.md): the old key -> (the group, its option). A composed config carries the old section at its
# defaults (register); a value given there that differs from them is taken into the option.
RENAMED = {"secagg": ("aggregation", "secagg")}


def _renamed(plain: dict) -> dict:
    """``plain`` with each old section of :data:`RENAMED` taken into its group's option (a shallow
    copy; the caller's dict is left as it is), and an old plain string ``aggregation: secagg`` read
    as that option. A value given both ways differently, or under another option, is refused."""
    if not isinstance(plain, dict) or not any(old in plain or isinstance(plain.get(group), str)
                                              for old, (group, _) in RENAMED.items()):
        return plain
    out = dict(plain)
    for old, (group, name) in RENAMED.items():
        legacy = out.pop(old, None)
        chosen = out.get(group)
        if isinstance(chosen, str):  # a config.yaml written before the group existed
            chosen = {"name": chosen}
        if legacy is None:
            if chosen is not None:
                out[group] = chosen
            continue
        if not isinstance(legacy, dict):
            _fail(old, "a mapping", legacy)
        defaults = as_dict(option_preset(group, name))
        given = {k: v for k, v in legacy.items() if k not in defaults or v != defaults[k]}
        if not given:
            if chosen is not None:
                out[group] = chosen
            continue
        chosen = dict(chosen or {})
        if chosen.get("name", DEFAULT_OPTIONS[group]) != name:
            first = next(iter(given))
            raise ConfigError(f"{old}.{first} is a setting of {group}={name} (now {group}.{first}): "
                              f"add {group}={name}, or leave it out")
        for key, value in given.items():
            if key in chosen and chosen[key] != value and chosen[key] != defaults.get(key):
                raise ConfigError(f"{old}.{key}={value} and {group}.{key}={chosen[key]} are both given: {old}.{key} "
                                  f"is the old spelling of {group}.{key}; give it once")
            chosen[key] = value
        out[group] = chosen
    return out


def as_dict(section: Any) -> Any:
    """The plain-dict form of a section (what Hydra composes and the run computes with),
    registered sections included (with their defaults where the instance has none)."""
    if not (dataclasses.is_dataclass(section) and not isinstance(section, type)):
        return section
    out = {f.name: as_dict(getattr(section, f.name)) for f in dataclasses.fields(section)}
    for name, sub in SECTIONS.get(type(section), {}).items():
        out[name] = as_dict(getattr(section, name, None) or sub())
    return out


def complete(plain: dict, parsed: RunConfig) -> RunConfig:
    """Add, in place, ``parsed``'s default for every key ``plain`` lacks (a composed config lacks
    none), a default of the form ``${a.b}`` (Hydra interpolation) read from the completed config;
    returns ``parsed`` with those interpolated defaults resolved the same way."""
    _fill(plain, as_dict(parsed), plain)
    return _interpolated(parsed, plain)


def _fill(plain: dict, defaults: dict, root: dict) -> None:
    for key, value in defaults.items():
        if key not in plain:
            plain[key] = lookup(value, root)
        elif isinstance(value, dict) and isinstance(plain[key], dict):
            _fill(plain[key], value, root)


def _interpolated(section: Any, root: dict) -> Any:
    """``section`` with each ``${a.b}`` string field replaced by ``root``'s value at ``a.b``."""
    if not (dataclasses.is_dataclass(section) and not isinstance(section, type)):
        return section
    changes = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        new = _interpolated(value, root) if dataclasses.is_dataclass(value) else lookup(value, root)
        if new is not value:
            changes[f.name] = new
    return dataclasses.replace(section, **changes) if changes else section


def lookup(value: Any, root: Mapping[str, Any]) -> Any:
    """A default of the form ``${a.b}`` (Hydra interpolation) read from ``root``; else ``value``
    (the one reader of such defaults: the parser's and the research key's)."""
    if isinstance(value, str) and value.startswith("${") and value.endswith("}") and ":" not in value:
        node: Any = root
        for part in value[2:-1].split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        return node
    return value


def register() -> None:
    """Register every group option, and the top-level defaults as ``fedpriv_defaults``, with
    Hydra's ConfigStore (plain-dict nodes: types are checked by :func:`parse`, with fedpriv's
    messages). Idempotent."""
    from hydra.core.config_store import ConfigStore  # lazy: hydra, kept off `import fedpriv.schema` (the CLIs)

    _import_section_plugins()
    store = ConfigStore.instance()
    top = {k: v for k, v in as_dict(RunConfig()).items() if k not in GROUPS}
    for old, (group, name) in RENAMED.items():  # the old spelling's keys, at the option's defaults (parse)
        top[old] = {k: v for k, v in as_dict(options(group)[name]).items() if k != "name"}
    store.store(name="fedpriv_defaults", node=top)
    for group in GROUPS:
        for name, option in options(group).items():
            store.store(group=group, name=name, node=as_dict(option))


def describe(section: Any, path: str = "") -> list[str]:
    """The keys of a parsed section (a :class:`RunConfig` from :func:`parse`) as YAML lines, each
    with its value and its one-line meaning as a comment (:func:`~fedpriv.schema.sections.meanings`,
    the comments in the schema's source); a group's line names its options. What ``python -m
    fedpriv.simulate [OVERRIDES] --help`` prints."""
    indent = "  " * path.count(".") + ("  " if path else "")
    names, _ = _fields(type(section))
    meaning = meanings(type(section))
    lines = []
    for name in names:
        value = getattr(section, name, None)
        if name == "name" and isinstance(section, Option):
            lines.append(f"{indent}name: {value}  # the implementation the chosen option selects")
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            sub = _key(path, name)
            note = (f"chosen with {name}=OPTION, one of: {', '.join(sorted(options(name)))}"
                    if name in GROUPS and not path else meaning.get(name) or _summary(type(value)))
            lines.append(f"{indent}{name}:" + (f"  # {note}" if note else ""))
            lines += describe(value, sub)
        else:
            note = meaning.get(name)
            lines.append(f"{indent}{name}: {_shown(value)}" + (f"  # {note}" if note else ""))
    return lines


def _shown(value: Any) -> str:
    """A value as the command line writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    return str(value) if value != "" else "''"


def _summary(cls: type) -> str:
    """The first sentence of a section class's own docstring, without its ``key``: prefix."""
    doc = cls.__dict__.get("__doc__") or ""
    if not doc or doc.startswith(f"{cls.__name__}("):  # dataclass's generated signature: no docstring
        return ""
    text = re.split(r"\.\s+(?=[A-Z])", " ".join(doc.split()))[0].rstrip(".")
    return text.split(": ", 1)[1] if text.startswith("``") and ": " in text else text


def known_keys(path: str) -> list[str] | None:
    """The valid keys under the node at dotted ``path`` ("" for the top level; for a group, those
    of any of its options), or None when ``path`` names no section."""
    cls: Any = RunConfig
    classes = [cls]
    for part in [p for p in path.split(".") if p]:
        nxt = []
        for c in classes:
            if c is RunConfig and part in GROUPS:
                nxt += list({type(o) for o in options(part).values()})
                continue
            tp = _fields(c)[1].get(part)
            if isinstance(tp, type) and dataclasses.is_dataclass(tp):
                nxt.append(tp)
        if not nxt:
            return None
        classes = nxt
    return sorted({name for c in classes for name in _fields(c)[0]})


def load(kind: type[Section] | str, data: Any, path: str = "") -> Any:
    """One section from a plain mapping, checked and with its defaults: ``kind`` is a section
    class (``load(Public, cfg["public"], "public")``) or a group name, whose option the mapping's
    ``name`` selects (``load("mechanism", {"name": "tree"})``)."""
    if isinstance(kind, str):
        return _option(kind, data, path or kind)
    return _section(dict(data) if data is not None else {}, kind, path)
