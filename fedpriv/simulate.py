"""Hydra entry point: ``python -m fedpriv.simulate [+experiment=NAME] [key=value ...]``.

Bad input (an invalid value, an unknown config-group option, a missing data file, a damaged run
directory) prints one ``error: ...`` line to stderr and exits with code 2 without leaving files
behind; a run directory in use by another run is refused the same way and left untouched. A
failed write (a full disk) prints one ``error: ...`` line and exits 1; the last checkpoint stays
usable for ``resume=true``.
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


# Run directories named on the command line that existed before Hydra created anything: a failed
# run never removes them, even when they are empty.
_PREEXISTING: set[Path] = set()


def _note_preexisting(args: list[str]) -> None:
    for arg in args:
        key, _, value = arg.partition("=")
        if key.lstrip("+~") in ("run_dir", "hydra.run.dir") and value and Path(value).exists():
            _PREEXISTING.add(Path(value).resolve())


def _run(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from fedpriv.errors import ConfigError, OutputError, PrivacyBudgetExceeded
    from fedpriv.rundir import RunDirectory
    from fedpriv.runner import format_result, prepare
    from server.app import BACKENDS

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    run = RunDirectory(run_dir)
    try:
        run.lock()  # refused: another run uses it; leave everything as it is
    except ConfigError as err:
        _fail(str(err))
    run.created = run_dir.resolve() not in _PREEXISTING  # Hydra made it for this run
    try:
        plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        plain["run_dir"] = str(run_dir)
        if (plain.get("backend") or {}).get("name") == "deployment":
            raise ConfigError("backend=deployment runs under `flwr run` against a SuperLink: "
                              "use scripts/deploy_local.sh (see README)")
        session = prepare(plain, run=run)
    except (ConfigError, PrivacyBudgetExceeded) as err:
        run.abandon()
        _fail(str(err))
    except Exception as err:  # OmegaConf errors: missing mandatory value, bad interpolation
        if type(err).__module__.startswith("omegaconf"):
            run.abandon()
            _fail(str(err).splitlines()[0])
        raise
    try:
        summary = BACKENDS[plain["backend"]["name"]](session)
    except OutputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    print(format_result(summary))
    print(f"outputs in {run_dir}")


def main() -> None:
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    logging.getLogger("flwr").setLevel(logging.WARNING)
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting: per-order RDP convergence notes
    check_group_overrides(sys.argv[1:])
    _note_preexisting(sys.argv[1:])
    import hydra

    hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")(_run)()


if __name__ == "__main__":
    main()
