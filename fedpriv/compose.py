"""The Hydra config tree as a plain dict, without ``@hydra.main`` — for the deployed Flower apps
(which get an experiment and overrides from Flower's run config) and the tests.

``compose_config(["+experiment=smoke", "rounds=2"], run_dir)`` is the resolved config that
``python -m fedpriv.simulate +experiment=smoke rounds=2 run_dir=RUN_DIR`` would run;
``deployment_config(run_config)`` is the one a deployed ServerApp and its ClientApps run.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedpriv.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def compose_config(overrides: Sequence[str], run_dir: str | os.PathLike) -> dict:
    """Compose ``configs/config.yaml`` with Hydra ``overrides``; bad overrides → ``ConfigError``."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("config", overrides=list(overrides))
        plain = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(str(err).splitlines()[0]) from None
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
