"""The option registry: which options each group has (``group=name``), the contract each group's
options meet (:data:`GROUP_BASES`, checked by :func:`register_option`), and the sections public
stages add (:func:`register_section`) and the sampler kinds (:func:`register_sampler_kind`).
Options and samplers register themselves from the modules that implement them; :func:`options`
and :func:`sampler_kinds` import those modules (by name: the config imports no implementation)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from typing import Any

from fedpriv.errors import ConfigError
from fedpriv.schema.sections import (AlgorithmOption, BackendOption, DeploymentBackend, FixedPlan, FlowerBackend,
                                     LocalBackend, MechanismOption, ModelOption, Option, OptimizerOption, PlanOption,
                                     SumOption, TextPipeline)


# group -> option name -> its defaults (the ConfigStore entries). The options register themselves
# from the modules that implement them (register_option); options() imports those modules.
OPTIONS: dict[str, dict[str, Option]] = {}
PLUGINS = {"data": "fedpriv.data", "model": "fedpriv.models", "algorithm": "fedpriv.round.algorithms",
           "mechanism": "fedpriv.mechanisms", "optimizer": "fedpriv.optim", "plan": "fedpriv.plan.auto",
           "aggregation": "fedpriv.sums"}
GROUPS = ("data", "model", "algorithm", "mechanism", "optimizer", "backend", "plan", "aggregation")
# the default option of each group (config.yaml's defaults list names the same)
DEFAULT_OPTIONS = {"data": "synthetic", "model": "lstm", "algorithm": "dp_fedavg", "mechanism": "gaussian",
                   "optimizer": "momentum", "backend": "local", "plan": "fixed", "aggregation": "plain"}


# group -> the contract its options meet (register_option checks it)
GROUP_BASES: dict[str, type[Option]] = {"data": TextPipeline, "model": ModelOption, "algorithm": AlgorithmOption,
                                        "mechanism": MechanismOption, "optimizer": OptimizerOption,
                                        "backend": BackendOption, "plan": PlanOption, "aggregation": SumOption}
_CLASS_ATTRIBUTES = {"model": ("model_class",), "algorithm": ("algorithm_class",), "mechanism": ("default_sampling",),
                     "aggregation": ("sees", "noise_by")}


def register_option(group: str, name: str, option: Option) -> None:
    """Make ``option`` (its dataclass and defaults) selectable as ``group=name``: called by the
    module implementing it, so adding an option touches no list elsewhere. The option must meet its
    group's contract (:data:`GROUP_BASES`): an instance of the group's base, every abstract method
    implemented, every class attribute the run reads defined (``TypeError`` otherwise)."""
    if group not in GROUP_BASES:
        raise TypeError(f"unknown option group {group!r} (one of: {', '.join(GROUP_BASES)})")
    base = GROUP_BASES[group]
    cls = type(option)
    if not (dataclasses.is_dataclass(option) and isinstance(option, base)):
        raise TypeError(f"{group} option {name!r} must be a dataclass instance of {base.__module__}.{base.__name__}")
    missing = sorted(getattr(cls, "__abstractmethods__", ())) + [
        attr for attr in _CLASS_ATTRIBUTES.get(group, ()) if not hasattr(cls, attr)]
    if missing or inspect.isabstract(cls):
        raise TypeError(f"{group} option {name!r} ({cls.__name__}) does not implement: {', '.join(missing)}")
    if not isinstance(option.name, str) or not option.name:
        raise TypeError(f"{group} option {name!r} has no name")
    OPTIONS.setdefault(group, {})[name] = option


for _backend in (LocalBackend(), FlowerBackend(), DeploymentBackend()):
    register_option("backend", _backend.name, _backend)
register_option("plan", "fixed", FixedPlan())


def options(group: str) -> dict[str, Option]:
    """The options of ``group`` (importing the package whose modules register them)."""
    if group in PLUGINS:
        importlib.import_module(PLUGINS[group])
    return OPTIONS.get(group, {})


# the kinds ``sampling=KIND`` may name: fedpriv.sampling.register_sampler adds each (its factory
# stays there); read through sampler_kinds(), which imports the module registering the built-ins
SAMPLER_KINDS: set[str] = set()
SAMPLER_PLUGINS = ("fedpriv.sampling",)


def register_sampler_kind(kind: str) -> None:
    """Make ``kind`` a valid ``sampling=`` value (called by :func:`fedpriv.sampling.register_sampler`)."""
    SAMPLER_KINDS.add(kind)


def sampler_kinds() -> set[str]:
    """The registered sampler kinds (importing the module whose samplers register themselves)."""
    for name in SAMPLER_PLUGINS:
        importlib.import_module(name)
    return SAMPLER_KINDS


# parent section class -> key -> the section class another module registered under it
SECTIONS: dict[type, dict[str, type]] = {}
SECTION_PLUGINS = ("fedpriv.public",)  # packages whose modules register sections (public stages)


def register_section(parent: type, key: str, section: type) -> None:
    """Add the section ``section`` (a dataclass with defaults) under ``parent`` as ``key``: a
    public stage's settings live in ``public.<key>`` without an edit of this file."""
    SECTIONS.setdefault(parent, {})[key] = section


def _import_section_plugins() -> None:
    for name in SECTION_PLUGINS:
        if name not in sys.modules:
            importlib.import_module(name)


def _default(group: str):
    return lambda: dataclasses.replace(options(group)[DEFAULT_OPTIONS[group]])


def option_preset(group: str, name: Any) -> Option | None:
    """The registered defaults of option ``name`` (``optimizer=dpadagrad_bc`` has lr 0.1, not the
    class's 0.01): the preset registered under that name, else the first whose ``name`` it is."""
    found = options(group)
    if name in found and found[name].name == name:
        return found[name]
    return next((o for o in found.values() if o.name == name), None)


def option_class(group: str, name: Any, path: str) -> type[Option]:
    """The dataclass of the option whose ``name`` is ``name`` (several presets may share one)."""
    classes = {opt.name: type(opt) for opt in options(group).values()}
    if name not in classes:
        raise ConfigError(f"unknown {path}.name {name!r} (choose one of: {', '.join(sorted(classes))})")
    return classes[name]
