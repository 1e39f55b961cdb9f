"""The Hydra config tree as a plain dict, without ``@hydra.main`` — for the deployed Flower apps
(which get an experiment and overrides from Flower's run config) and the tests.

``compose_config(["+experiment=smoke", "rounds=2"], run_dir)`` is the resolved config that
``python -m fedpriv.simulate +experiment=smoke rounds=2 run_dir=RUN_DIR`` would run;
``deployment_config(run_config)`` is the one a deployed ServerApp and its ClientApps run.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedpriv.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def hydra_error(err: Exception) -> ConfigError:
    """Hydra's multi-line composition error as one line; an unknown key names the closest valid one."""
    from fedpriv.schema import known_keys, unknown_key

    text = str(err)
    match = re.match(r"Could not override '([^']+)'", text)
    if match:
        path, _, key = match.group(1).rpartition(".")
        known = known_keys(path)
        if known is not None and key not in known:
            return unknown_key(path, key, known)
    return ConfigError((text.splitlines() or [type(err).__name__])[0])


def compose_config(overrides: Sequence[str], run_dir: str | os.PathLike | None = None) -> dict:
    """Compose ``configs/config.yaml`` with Hydra ``overrides`` (the schema's defaults registered
    first); bad overrides → ``ConfigError``. ``run_dir`` replaces the composed one when given."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from fedpriv.schema import register

    register()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("config", overrides=list(overrides))
        plain = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise hydra_error(err) from None
    if run_dir is not None:
        plain["run_dir"] = str(run_dir)
    return plain


def deployment_config(run_config: Mapping[str, object]) -> dict:
    """The resolved config of a deployed run (server and clients compose the same one) from a
    Flower run config: ``experiment`` (a configs/experiment name, or empty for the default),
    ``overrides`` (Hydra overrides as one shell-quoted string, e.g. ``"rounds=2
    privacy.target_epsilon=4"``) and ``run-dir``; ``backend=deployment`` is implied."""
    experiment = str(run_config.get("experiment") or "")
    overrides = [f"+experiment={experiment}"] if experiment else []
    overrides += shlex.split(str(run_config.get("overrides") or "")) + ["backend=deployment"]
    return compose_config(overrides, run_dir=str(run_config.get("run-dir") or "outputs/deployment"))


def group_options(group: str) -> list[str]:
    """The options of a config group: the schema's ConfigStore entries, or the YAML files of
    ``configs/<group>/`` (experiments)."""
    from fedpriv.schema import GROUPS, options

    if group in GROUPS:
        return sorted(options(group))
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


MAX_CHECKED_SWEEP = 64  # sweep combinations validated one by one; beyond, each value on its own


def check_overrides(args: Sequence[str], multirun: bool = False) -> None:
    """Validate command-line ``args`` as ``python -m fedpriv.simulate`` would run them, before
    Hydra creates anything: every group option exists, every key is known (the closest valid one
    named), every composed config passes the typed schema — for each member of a ``-m`` sweep.
    Raises ``ConfigError`` (one line). Hydra's own settings (``hydra.*``) are left to Hydra."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from fedpriv.schema import GROUPS, parse

    plain_args = [a for a in args if not a.startswith("-")]
    try:
        overrides = OverridesParser.create().parse_overrides(plain_args)
    except HydraException as err:
        raise ConfigError(str(err).splitlines()[0]) from None
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
    for combo in combos:
        parse(compose_config(list(combo)))
