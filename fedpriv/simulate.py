"""Hydra entry point: ``python -m fedpriv.simulate [+experiment=NAME] [key=value ...]``.

Bad input (an invalid value, an unknown config-group option, a missing or damaged data file, a
damaged run directory, a ``run_dir`` that is a file or under one) prints one ``error: ...`` line to
stderr and exits with code 2 without leaving files behind; a run directory in use by another run
is refused the same way and left untouched. A failed write (a full disk, a ``run_dir`` the file
system will not create) prints one ``error: ...`` line and exits 1; the last checkpoint stays
usable for ``resume=true``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from fedpriv.config.compose import CONFIG_DIR, check_overrides, compose_config, group_options
from fedpriv.release.console import fail as _fail
from fedpriv.release.console import interrupted_message, set_member
from fedpriv.release.result_lines import format_result
from fedpriv.errors import ConfigError, OutputError, PrivacyBudgetExceeded
from fedpriv.schema import describe, parse, register


def check_args(args: list[str]) -> None:
    """Validate the command line before Hydra creates anything (one ``error:`` line, exit 2):
    unknown options, keys (with the closest valid one), types and ranges of every sweep member."""
    try:
        members = check_overrides(args, multirun=bool({"-m", "--multirun"} & set(args)))
    except ConfigError as err:
        _fail(str(err))  # before torch and dp_accounting are imported: about 2 s sooner
    from fedpriv.plan import preflight_sweep  # lazy: torch, dp_accounting and the data, after the arguments are checked

    try:
        preflight_sweep(members)
    except ConfigError as err:
        _fail(str(err))


def print_help(args: list[str]) -> None:
    """``--help`` (``-h``): the usage, the experiments, and every key of the config the other
    arguments compose (``+experiment=smoke --help`` shows the smoke values) with its value and its
    one-line meaning (the schema's comments, :func:`fedpriv.schema.describe`); of a sweep (``-m``),
    its first member's. Bad overrides are one ``error:`` line and exit 2, as for a run."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # lazy: hydra, only for --help
    from hydra.errors import HydraException  # lazy: hydra, only for --help

    parser, overrides, swept = OverridesParser.create(), [], False
    for arg in (a for a in args if a not in ("-h", "--help", "-m", "--multirun")):
        try:
            override = parser.parse_override(arg)
        except HydraException:
            override = None  # compose_config refuses it in one line
        if override is not None and override.is_sweep_override():  # the first member's value
            arg, swept = f"{arg.partition('=')[0]}={next(override.sweep_string_iterator())}", True
        overrides.append(arg)
    try:
        lines = describe(parse(compose_config(overrides)))
    except ConfigError as err:
        _fail(str(err))
    print("usage: python -m fedpriv.simulate [+experiment=NAME] [key=value ...]        one run\n"
          "       python -m fedpriv.simulate -m [+experiment=NAME] [key=a,b ...]    a sweep: a run per combination\n"
          f"experiments (+experiment=NAME; two as +experiment=[a,b]): {', '.join(group_options('experiment'))}\n"
          f"keys (key=value), with the values of this command line{' (its first sweep member)' if swept else ''} "
          "and what each means:")
    print("\n".join(f"  {line}" for line in lines))
    print("Hydra's own flags: --hydra-help. Outputs of a run: docs/OUTPUTS.md.")
    sys.exit(0)


# Run directories named on the command line that existed before Hydra created anything: a failed
# run never removes them, even when they are empty.
_PREEXISTING: set[Path] = set()


def _given_directories(args: list[str]) -> dict[str, str]:
    """The values of ``run_dir``, ``hydra.run.dir`` and ``hydra.sweep.dir`` the command line gives
    (parsed as Hydra reads them: quotes removed); a value Hydra interpolates is left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # lazy: hydra, after the checks

    parser, given = OverridesParser.create(), {}
    for arg in args:
        if arg.partition("=")[0].lstrip("+~") not in ("run_dir", "hydra.run.dir", "hydra.sweep.dir"):
            continue
        override = parser.parse_override(arg)  # check_args read every argument already
        value = override.value()
        if isinstance(value, str) and value and "${" not in value:
            given[override.get_key_element().lstrip("+~")] = value
    return given


def _note_preexisting(given: dict[str, str]) -> None:
    from fedpriv.release.rundir import note_existing  # lazy: rundir imports torch

    for key in ("run_dir", "hydra.run.dir"):
        if key in given:
            note_existing(given[key])  # a refused run also removes the empty parents Hydra creates for it
            if Path(given[key]).exists():
                _PREEXISTING.add(Path(given[key]).resolve())


def _make_output_directory(given: dict[str, str], multirun: bool) -> None:
    """Create the directory Hydra would create for the run (``hydra.run.dir``, else ``run_dir``) or
    the sweep (``hydra.sweep.dir``) where the command line names it, so that one that cannot be a
    directory is one ``error:`` line — exit 2 for a file or a path under one, 1 where the file
    system refuses — with nothing left behind, instead of Hydra's traceback."""
    from fedpriv.release.rundir import make_run_directory  # lazy: rundir imports torch

    keys = ("hydra.sweep.dir",) if multirun else ("hydra.run.dir", "run_dir")
    key = next((k for k in keys if k in given), None)
    if key is None:
        return
    try:
        make_run_directory(given[key], key)
    except ConfigError as err:
        _fail(str(err))
    except OutputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)


def _run(cfg) -> None:
    # lazy: hydra and the run's modules (torch), once the arguments are checked
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf
    # lazy: as above
    from fedpriv.backends import backend
    from fedpriv.release.rundir import RunDirectory
    from fedpriv.runner import prepare

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:  # this member's stderr lines name it
        set_member(hydra_cfg.job.num, list(hydra_cfg.overrides.task), sys.argv[1:])
    run_dir = Path(hydra_cfg.runtime.output_dir)
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
                              "use scripts/deploy_local.sh (docs/DEPLOYMENT.md)")
        run_backend = backend(plain["backend"]["name"])  # an unregistered backend: one error line, nothing written
        session = prepare(plain, run=run)
    except (ConfigError, PrivacyBudgetExceeded) as err:
        run.abandon()
        _fail(str(err))
    except KeyboardInterrupt:  # during setup: leave no empty directory behind
        run.abandon()
        raise
    except Exception as err:  # OmegaConf errors: missing mandatory value, bad interpolation
        if type(err).__module__.startswith("omegaconf"):
            run.abandon()
            _fail(str(err).splitlines()[0])
        raise
    try:
        summary = run_backend(session)
    except OutputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except ConfigError as err:  # refused mid-run (a client's engine found that the model mixes samples)
        _fail(stopped_message(err, session.ledger.rounds_done, session.spec.rounds))
    except KeyboardInterrupt:  # Ctrl-C: the last checkpoint is left as it is, for resume=true
        summary = None
    if summary is None:  # outside the handler, so the progress bar is closed before the line below
        run.unlock()  # train() released it already, unless Ctrl-C reached Flower's engine outside train()
        print(interrupted_message(run, list(HydraConfig.get().overrides.task)), file=sys.stderr)
        if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.current_thread()):
            # backend=flower: its ServerApp thread waits for replies from the stopped engine, and
            # would keep the process from exiting; no file is half-written (every write is atomic)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(_exit_code())
        sys.exit(_exit_code())
    print(format_result(summary))
    print(f"outputs in {run_dir}")


def stopped_message(err: Exception, done: int, rounds: int) -> str:
    """The ``error:`` line of a run refused after ``done`` of its ``rounds`` rounds: what was
    published (each round's checkpoint, metrics and ledger are written together after it) stays."""
    kept = ("no round was completed" if not done else "round 1 stays published and consistent" if done == 1
            else f"rounds 1-{done} stay published and consistent")
    return f"{err} (the run stopped at round {done + 1} of {rounds}: {kept}; round {done + 1} released nothing)"


# the signal that stopped the run (SIGTERM from a scheduler, or SIGINT): its exit code is 128 + its number
_STOPPED_BY: list[int] = []


def _stop(signum, frame) -> None:
    """SIGTERM behaves as Ctrl-C: the run stops at the next point it can, leaves its last
    checkpoint for resume=true and prints one line (exit code 143)."""
    _STOPPED_BY.append(signum)
    raise KeyboardInterrupt


def _exit_code() -> int:
    return 128 + (_STOPPED_BY[0] if _STOPPED_BY else 2)  # 130: SIGINT


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    if {"-h", "--help"} & set(sys.argv[1:]):
        rest = [a for a in sys.argv[1:] if a not in ("-h", "--help")]
        check_args(rest)  # the refusals a run of the same line gets (every sweep member), then the help
        print_help(rest)
    check_args(sys.argv[1:])
    given = _given_directories(sys.argv[1:])
    _note_preexisting(given)
    _make_output_directory(given, multirun=bool({"-m", "--multirun"} & set(sys.argv[1:])))
    import hydra  # lazy: hydra, once the arguments are checked

    register()

    try:
        hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")(_run)()
    except KeyboardInterrupt:  # before training started (Ctrl-C during training is handled in _run)
        print("error: interrupted before training started; no round was run", file=sys.stderr)
        sys.exit(_exit_code())


if __name__ == "__main__":
    main()
