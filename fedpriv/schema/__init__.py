"""The typed run configuration: one dataclass per config section, and one per option of the
groups that choose between implementations (data, model, algorithm, mechanism, optimizer,
backend, plan, aggregation), holding the only copy of every default and the checks of its own fields. The sections
(client, public, privacy, the top level) and the backends live here; every other option's
dataclass lives next to its implementation, which registers it (:func:`register_option`), and
public stages may register sections of their own (:func:`register_section`).

All are registered with Hydra's ConfigStore (:func:`register`): the options of a group *are*
ConfigStore entries, so YAML under configs/ keeps only experiments and the defaults list.
:func:`parse` turns a composed config (a plain dict) into a :class:`RunConfig`, refusing

* an unknown or misspelt key, naming it and the closest valid key;
* a value of the wrong type — strictly: ``3.0`` is not an int, ``"no"`` is not a bool, ``"abc"``
  is not a number (nothing is coerced, so a typo never turns into a truthy value);
* a value out of its range, and combinations no run supports;

each as one :class:`~fedpriv.errors.ConfigError` line (exit 2 on the CLI), before anything is
written. A composed config already holds every key, so the dict the run computes with is exactly
what Hydra composed (its research key, a hash of the config, is what reproducibility rests on);
a partial dict given to ``fedpriv.config.resolve.validate`` is completed with the defaults first.

The package's modules, each one job: :mod:`.checks` (field validators, field roles),
:mod:`.sections` (the sections and each group's contract), :mod:`.registry` (options,
registered sections, sampler kinds), :mod:`.run_config` (the whole run), :mod:`.parser` (parsing, plain form,
Hydra). Everything is importable from ``fedpriv.schema``.
"""

from __future__ import annotations

from fedpriv.schema.checks import (LOCATION, PRESENTATION, divisible, in_unit_interval, nonnegative,  # noqa: F401
                                   positive)
from fedpriv.schema.parser import (as_dict, complete, describe, known_keys, load, lookup, parse, register,  # noqa: F401
                                   unknown_key)
from fedpriv.schema.registry import (DEFAULT_OPTIONS, GROUP_BASES, GROUPS, OPTIONS, PLUGINS, SECTIONS,  # noqa: F401
                                     SAMPLER_KINDS, option_class, option_preset, options, register_option,
                                     register_sampler_kind, register_section, sampler_kinds)
from fedpriv.schema.run_config import RunConfig, resolve_secure, secure_mode  # noqa: F401
from fedpriv.schema.sections import (AdaptiveClipping, AlgorithmOption, Audit, BackendOption, Client,  # noqa: F401
                                     DeploymentBackend, ExampleDP, FixedPlan, FlowerBackend, LocalBackend,
                                     MechanismOption, ModelOption, Option, OptimizerOption, PlanOption, Privacy,
                                     Public, Section, SumOption, TeacherModel, TextPipeline, meanings)
