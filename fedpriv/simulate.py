"""Hydra entry point: ``python -m fedpriv.simulate [+experiment=NAME] [key=value ...]``.

Bad input (an invalid value, an unknown config-group option, a missing data file) prints one
``error: ...`` line to stderr and exits with code 2 without leaving files behind.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from fedpriv.compose import CONFIG_DIR
GROUPS = ("experiment", "data", "model", "algorithm", "mechanism", "optimizer", "backend")


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def check_group_overrides(args: list[str]) -> None:
    """Reject ``group=option`` overrides naming a config file that does not exist (one line, exit 2)."""
    for arg in args:
        if "=" not in arg or arg.startswith("-"):
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key not in GROUPS:
            continue
        for option in value.split(","):
            if option and not (CONFIG_DIR / key / f"{option}.yaml").exists():
                known = sorted(p.stem for p in (CONFIG_DIR / key).glob("*.yaml"))
                _fail(f"unknown {key} {option!r} (choose one of: {', '.join(known)})")


def _remove_if_empty(path: Path) -> None:
    """Undo the run directory Hydra created before the config was found invalid."""
    try:
        for sub in sorted(path.rglob("*"), reverse=True):
            if sub.is_dir():
                sub.rmdir()
        path.rmdir()
    except OSError:
        pass  # not empty: it held an earlier run, leave it


def _run(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from fedpriv.errors import ConfigError, PrivacyBudgetExceeded
    from fedpriv.runner import format_result, prepare
    from server.app import BACKENDS

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        plain["run_dir"] = str(run_dir)
        if (plain.get("backend") or {}).get("name") == "deployment":
            raise ConfigError("backend=deployment runs under `flwr run` against a SuperLink: "
                              "use scripts/deploy_local.sh (see README)")
        session = prepare(plain)
    except (ConfigError, PrivacyBudgetExceeded) as err:
        _remove_if_empty(run_dir)
        _fail(str(err))
    except Exception as err:  # OmegaConf errors: missing mandatory value, bad interpolation
        if type(err).__module__.startswith("omegaconf"):
            _remove_if_empty(run_dir)
            _fail(str(err).splitlines()[0])
        raise
    summary = BACKENDS[plain["backend"]["name"]](session)
    print(format_result(summary))
    print(f"outputs in {run_dir}")


def main() -> None:
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    logging.getLogger("flwr").setLevel(logging.WARNING)
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting: per-order RDP convergence notes
    check_group_overrides(sys.argv[1:])
    import hydra

    hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")(_run)()


if __name__ == "__main__":
    main()
