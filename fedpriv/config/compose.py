"""The Hydra config tree as a plain dict, without ``@hydra.main`` — for the deployed Flower apps
(which get an experiment and overrides from Flower's run config) and the tests.

``compose_config(["+experiment=smoke", "rounds=2"], run_dir)`` is the resolved config that
``python -m fedpriv.simulate +experiment=smoke rounds=2 run_dir=RUN_DIR`` would run;
``deployment_config(run_config)`` is the one a deployed ServerApp and its ClientApps run.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedpriv.errors import ConfigError
from fedpriv.schema import GROUPS, known_keys, options, parse, register, unknown_key
from fedpriv.schema.parser import RENAMED

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


# Hydra's own command-line flags (anything else that starts with '-' is a mistyped override)
HYDRA_FLAGS = frozenset({"-m", "--multirun", "-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "-p",
                         "--package", "-i", "--info", "--resolve", "-cp", "--config-path", "-cn", "--config-name",
                         "-cd", "--config-dir", "-sc", "--shell-completion", "--run", "-r", "--experimental-rerun"})


def options_with_key(group: str, key: str) -> list[str]:
    """The options of config ``group`` that have the top-level key ``key``."""
    return sorted(name for name, option in options(group).items()
                  if key in {f.name for f in dataclasses.fields(type(option))})


def hydra_error(err: Exception, overrides: Sequence[str] = (), multirun: bool = False) -> ConfigError:
    """Hydra's multi-line composition error as one line that says what to do: an unknown key names
    the closest valid one; a key of another option of a group names the options that have it;
    ``experiment`` needs ``+``; two experiments are one list."""
    text = str(err)
    first = (text.splitlines() or [type(err).__name__])[0]
    if first.startswith("Multiple values for experiment"):
        return ConfigError("two experiments are given as one list: +experiment=[smoke,distill] "
                           "(the later one wins where they overlap)")
    match = re.match(r"Could not override '([^']+)'", text)
    if not match:
        return ConfigError(first)
    path, _, key = match.group(1).rpartition(".")
    if not path and key == "experiment":
        return ConfigError("experiment is not chosen by default: add it with a plus, +experiment=NAME "
                           f"(one of: {', '.join(group_options('experiment'))})")
    group, _, rest = path.partition(".")
    if group in GROUPS:
        top = (rest.split(".") or [key])[0] or key
        having = options_with_key(group, top)
        if having:
            chosen = _chosen_option(group, overrides, match.group(1))
            where = f"{group}={chosen}" if chosen else f"the chosen {group} option"
            hint = (f"; in a sweep over several {group} options every override applies to each member: run one "
                    f"sweep per {group} option (docs/EXPERIMENTS.md, 'Sweeps and reports')") if multirun else ""
            return ConfigError(f"'{match.group(1)}' is not a key of {where}; it is a key of "
                               f"{group}={', '.join(having)}: choose that option first, e.g. "
                               f"{group}={having[0]} {match.group(1)}=...{hint}")
    known = known_keys(path)
    if known is not None and key not in known:
        return unknown_key(path, key, known)
    return ConfigError(first)


def _chosen_option(group: str, overrides: Sequence[str], failing: str) -> str | None:
    """The ``group`` option the ``overrides`` (less the failing key's) select, as Hydra names it
    (a preset such as ``model=transformer_tiny``), or None."""
    from hydra import compose, initialize_config_dir  # lazy: hydra (~0.15 s), kept off make_hf --help

    rest = [o for o in overrides if o.partition("=")[0].lstrip("+~") != failing]
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("config", overrides=rest, return_hydra_config=True)
        return str(cfg.hydra.runtime.choices[group])
    except Exception:  # noqa: BLE001 — only a hint; the error is reported anyway
        return None


def compose_config(overrides: Sequence[str], run_dir: str | os.PathLike | None = None,
                   multirun: bool = False) -> dict:
    """Compose ``configs/config.yaml`` with Hydra ``overrides`` (the schema's defaults registered
    first); bad overrides → ``ConfigError``. ``run_dir`` replaces the composed one when given."""
    # lazy: hydra and omegaconf (~0.15 s), kept off make_hf --help (and off importing this module)
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("config", overrides=list(overrides))
        plain = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise hydra_error(err, overrides, multirun) from None
    if run_dir is not None:
        plain["run_dir"] = str(run_dir)
    return plain


def deployment_overrides(run_config: Mapping[str, object]) -> list[str]:
    """The Hydra overrides of a deployed run, from a Flower run config: ``experiment`` (a
    configs/experiment name, or empty for the default), ``overrides`` (Hydra overrides as one
    shell-quoted string, e.g. ``"rounds=2 privacy.target_epsilon=4"``), then ``backend=deployment``
    — its command line, as ``python -m fedpriv.simulate`` would read it (:func:`check_overrides`)."""
    experiment = str(run_config.get("experiment") or "")
    overrides = [f"+experiment={experiment}"] if experiment else []
    return overrides + shlex.split(str(run_config.get("overrides") or "")) + ["backend=deployment"]


def deployment_config(run_config: Mapping[str, object]) -> dict:
    """The resolved config of a deployed run (server and clients compose the same one) from a
    Flower run config (:func:`deployment_overrides`; ``run-dir``: where its outputs go). The
    deployed server checks its overrides first (``server.deploy.server_config``)."""
    return compose_config(deployment_overrides(run_config),
                          run_dir=str(run_config.get("run-dir") or "outputs/deployment"))


def group_options(group: str) -> list[str]:
    """The options of a config group: the schema's ConfigStore entries, or the YAML files of
    ``configs/<group>/`` (experiments)."""
    if group in GROUPS:
        return sorted(options(group))
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


MAX_CHECKED_SWEEP = 64  # sweep combinations validated one by one; beyond, each value on its own


def check_overrides(args: Sequence[str], multirun: bool = False) -> list[tuple[str, dict, tuple[str, ...]]]:
    """Validate command-line ``args`` as ``python -m fedpriv.simulate`` would run them, before
    Hydra creates anything: every group option exists, every key is known (the closest valid one
    named), every composed config passes the typed schema — for each member of a ``-m`` sweep.
    Raises ``ConfigError`` (one line). Hydra's own settings (``hydra.*``) are left to Hydra.
    Returns the members checked: (the overrides that name it, its composed config, the settings typed
    for it: its ``key=value`` overrides), for the checks that need the data
    (:func:`fedpriv.plan.preflight_sweep`, called by the entry point)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # lazy: hydra, as above
    from hydra.errors import HydraException  # lazy: hydra, as above

    for i, arg in enumerate(args):
        if arg.startswith("-") and arg.split("=")[0] not in HYDRA_FLAGS:
            key = arg.lstrip("-").partition("=")[0]
            value = arg.partition("=")[2] or (args[i + 1] if i + 1 < len(args) else "VALUE")
            raise ConfigError(f"{arg!r} is not an option: settings are key=value overrides, e.g. {key}={value} "
                              "(python -m fedpriv.simulate --help lists them)")
    plain_args = [a for a in args if not a.startswith("-") and not _flag_value(args, a)]
    parser = OverridesParser.create()
    overrides = []
    for i, arg in enumerate(plain_args):
        try:
            overrides.append(parser.parse_override(arg))
        except HydraException as err:
            following = plain_args[i + 1] if i + 1 < len(plain_args) else None
            raise ConfigError(_unreadable(arg, following, str(err))) from None
    _refuse_repeats(overrides)
    choices: list[list[str]] = []
    for override in overrides:
        if override.is_hydra_override():
            continue
        key = override.get_key_element()
        group = override.key_or_group
        if override.is_sweep_override():
            if not multirun:
                raise ConfigError(f"{override.input_line!r} is a sweep: add -m (--multirun) to run one job per value")
            values = list(override.sweep_string_iterator())
        else:
            values = [override.get_value_element_as_str()] if not override.is_delete() or override.value() else [None]
        options = group_options(group) if group in ("experiment", *GROUPS) else None
        for value in values:
            names = value.strip("[]").split(",") if (options is not None and value) else []
            for name in (n.strip() for n in names):
                if name and name not in options:
                    raise ConfigError(f"unknown {group} {name!r} (choose one of: {', '.join(options)})")
        choices.append([key if v is None else f"{key}={v}" for v in values])
    combos = list(itertools.islice(itertools.product(*choices), MAX_CHECKED_SWEEP + 1))
    if len(combos) > MAX_CHECKED_SWEEP:  # too many: vary one override at a time
        firsts = [c[0] for c in choices]
        combos = [tuple(firsts[:i] + [v] + firsts[i + 1:]) for i, c in enumerate(choices) for v in c]
    swept = [i for i, c in enumerate(choices) if len(c) > 1]
    members = []
    for combo in combos:
        _check_noise_choice(combo)
        plain = compose_config(list(combo), multirun=multirun)
        parse(plain)
        members.append((" ".join(combo[i] for i in swept) or " ".join(combo), plain, combo))
    return members


def _unreadable(arg: str, following: str | None, reason: str) -> str:
    """The one-line error for the override ``arg`` that Hydra cannot read, naming it and the
    spelling that works (``following``: the next argument, the value of ``rounds 3``)."""
    key, sep, value = arg.partition("=")
    if not sep and ":" in arg:  # rounds:3
        key, _, value = arg.partition(":")
        return f"override {arg!r} is not key=value; write {key.strip()}={value.strip()}"
    if not sep:  # rounds 3, or a key alone
        value = following if following is not None and "=" not in following else "VALUE"
        return f"override {arg!r} is not key=value; write {arg}={value} (~{arg} deletes a key)"
    if value.startswith("="):  # rounds==3
        return f"override {arg!r} is not key=value; write {key}={value.lstrip('=')}"
    return (f"override {arg!r} cannot be read ({reason.splitlines()[0]}); write a list as {key}=[a,b], a sweep "
            f"as -m {key}=a,b, and quote a value with special characters: '{key}=\"...\"'")


def _refuse_repeats(overrides: Sequence) -> None:
    """A key given twice (``rounds=3 rounds=4``) is refused instead of the later value silently
    winning; sweeps list their values once (``-m rounds=3,4``). ``experiment`` and Hydra's own
    ``hydra.*`` settings are left to Hydra (two experiments are one list)."""
    seen: dict[str, tuple[str, str]] = {}  # the key (an old spelling read as its new one) -> (as given, the line)
    for override in overrides:
        given = override.get_key_element().lstrip("+~")
        if override.is_hydra_override() or given == "experiment":
            continue
        section, dot, rest = given.partition(".")
        key = f"{RENAMED[section][0]}.{rest}" if dot and section in RENAMED else given  # secagg.bits: aggregation.bits
        if key in seen:
            spelled, line = seen[key]
            if spelled != given:  # the old and the new spelling of one key, the old one named first
                old, old_line, new_line = ((given, override.input_line, line) if spelled == key
                                           else (spelled, line, override.input_line))
                raise ConfigError(f"{old_line} and {new_line} are both given: {old} is the old spelling of {key}; "
                                  "give it once")
            first, _, value = line.partition("=")
            both = f"{value},{override.input_line.partition('=')[2]}" if value else "a,b"
            raise ConfigError(f"{key} is given twice ({line} and {override.input_line}): give it once; "
                              f"to run both values, sweep them with -m {first}={both}")
        seen[key] = (given, override.input_line)


def _flag_value(args: Sequence[str], arg: str) -> bool:
    """Whether ``arg`` is the value of a Hydra flag that takes one (``--config-name NAME``)."""
    i = args.index(arg)
    return i > 0 and args[i - 1] in {"-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir",
                                     "-p", "--package", "-sc", "--shell-completion", "-i", "--info"}


def _check_noise_choice(combo: Sequence[str]) -> None:
    """A fixed noise multiplier and a target ε given together are refused (one must go): the
    multiplier would silently win and the target would be dropped."""
    given = {o.partition("=")[0].lstrip("+~"): o.partition("=")[2] for o in combo}
    sigma, target = given.get("privacy.noise_multiplier"), given.get("privacy.target_epsilon")
    if sigma not in (None, "", "null") and target not in (None, "", "null"):
        raise ConfigError(f"privacy.noise_multiplier={sigma} and privacy.target_epsilon={target} are both given: "
                          "a fixed multiplier is not calibrated to a target; drop one (ε then follows from σ, "
                          "or σ is calibrated to ε)")
