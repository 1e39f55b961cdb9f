"""What the CLIs print: `warning:` prefixes, one line on Ctrl-C (exit 130, resumable), a quiet
accounting calculator, plurals, and sweep-plot epsilon ticks that never overprint."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.warm_launcher import run_module

SMOKE = ("+experiment=smoke", "progress=false")


def _env() -> dict:
    return {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}


# --- 1. warnings read `warning: ...`; info lines stay as they are ------------------------------

def test_cli_warnings_go_to_stderr_with_a_prefix_info_lines_to_stdout_and_no_bar_into_a_pipe(run_cli, tmp_path):
    # delta 0.05 >= 1/N for the smoke corpus's 40 users: fedpriv.config.resolve warns; progress stays on (the default)
    proc = run_cli("+experiment=smoke", "rounds=1", "privacy.delta=0.05", "verbose=true", "progress=true",
                   f"run_dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr
    out, err = proc.stdout.splitlines(), proc.stderr.splitlines()
    warnings = [line for line in err if "privacy.delta=0.05 >= 1/N" in line]
    assert warnings and all(line.startswith("warning: privacy.delta=0.05 >= 1/N") for line in warnings), err
    assert not any("warning:" in line for line in out), out
    assert any(line.startswith("round=1 epsilon=") for line in out), out  # verbose line: no prefix, stdout
    assert any(line.startswith("final accuracy ") for line in out), out
    assert any(" 1 round [" in line for line in out), out  # and the plural (4.)
    assert "\r" not in proc.stderr and "rounds (" not in proc.stderr, proc.stderr  # no tqdm bar into a pipe


def test_below_level_filter():
    import logging

    from fedpriv.release.console import BelowLevelFilter

    def record(level: int) -> logging.LogRecord:
        return logging.LogRecord("fedpriv.x", level, __file__, 1, "m", (), None)

    keep = BelowLevelFilter("warning")
    assert keep.filter(record(logging.INFO)) and not keep.filter(record(logging.WARNING))
    assert not keep.filter(record(logging.ERROR)) and BelowLevelFilter(logging.ERROR).filter(record(logging.WARNING))


def test_console_formatter_prefixes_by_level():
    import logging

    from fedpriv.release.console import ConsoleFormatter

    fmt = ConsoleFormatter()

    def record(level: int) -> logging.LogRecord:
        return logging.LogRecord("fedpriv.x", level, __file__, 1, "a %s", ("b",), None)

    assert fmt.format(record(logging.INFO)) == "a b"
    assert fmt.format(record(logging.WARNING)) == "warning: a b"
    assert fmt.format(record(logging.ERROR)) == "error: a b"


# --- 1b. Flower's engine: the console holds fedpriv's own lines (issue 52, item 10) --------------

def _own_line(line: str) -> bool:
    """A line fedpriv prints on stderr: a warning or an error, or its advice before training."""
    return line.startswith(("warning: ", "error: ", "noise multiplier "))


def test_a_secure_flower_runs_stderr_holds_only_fedprivs_own_lines(run_cli, tmp_path):
    """``backend=flower aggregation=secagg`` under Ray: no Ray, Flower or absl line on the console
    (the nodes' SecAgg+ stage lines, dp_accounting's notes of excluded RDP orders), only fedpriv's."""
    proc = run_cli("+experiment=smoke", "backend=flower", "aggregation=secagg", "rounds=1", "progress=false",
                   f"run_dir={tmp_path / 'r'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert lines and [line for line in lines if not _own_line(line)] == [], proc.stderr
    assert not any(word in proc.stderr for word in ("absl", "flwr", "ClientAppActor", "Excluding this order"))
    assert " 1 round [" in proc.stdout


@pytest.mark.parametrize("shown", [False, True])
def test_library_logs_decide_what_ray_flower_and_the_nodes_print(tmp_path, monkeypatch, shown):
    """``backend.library_logs``: off (the default), Flower's and Ray's loggers pass errors only and
    the simulated nodes' output stays in Ray's logs; on, their warnings and the nodes' output too."""
    import logging

    import flwr.simulation

    from fedpriv.runner import prepare
    from server.app import run_flower_simulation
    from tests.conftest import compose_cfg

    seen = {}
    monkeypatch.setattr(flwr.simulation, "run_simulation", lambda **kwargs: seen.update(kwargs))
    for name in ("flwr", "ray"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)  # restored after
    session = prepare(compose_cfg("+experiment=smoke", "progress=false", "backend=flower",
                                  *(["backend.library_logs=true"] if shown else []), run_dir=tmp_path / "r"))
    with pytest.raises(RuntimeError, match="ended without a result"):  # the engine was not started
        run_flower_simulation(session)
    session.run.unlock()
    init = seen["backend_config"]["init_args"]
    level = logging.WARNING if shown else logging.ERROR
    assert init["log_to_driver"] is shown and init["logging_level"] == logging.getLevelName(level)
    assert logging.getLogger("flwr").level == level and logging.getLogger("ray").level == level


# --- 2. Ctrl-C: one line, exit 130, the checkpoint resumes --------------------------------------

def test_sigint_prints_one_line_exits_130_and_resumes(tmp_path):
    from fedpriv.release.rundir import RunDirectory

    run_dir = tmp_path / "run"
    rounds = 12  # 0.05-1 s a round on 2 cores: far from done when its first checkpoint lands; resumed in < 20 s
    args = [*SMOKE, f"rounds={rounds}", f"run_dir={run_dir}"]
    # a shell without job control starts background jobs with SIGINT ignored, and Python keeps an
    # ignored SIGINT ignored: restore the default in the child, as a terminal's Ctrl-C finds it
    proc = subprocess.Popen([sys.executable, "-m", "fedpriv.simulate", *args], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    checkpoint = run_dir / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 60
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, (stdout, stderr)
    lines = [line for line in stderr.splitlines() if "the averaged update gets noise" not in line]  # advice
    assert len(lines) == 1 and lines[0].startswith("error: interrupted"), stderr
    assert "Traceback" not in stdout + stderr
    run = RunDirectory(run_dir)
    state = run.load_checkpoint()  # intact
    done = int(state["round"])
    assert 1 <= done < rounds
    assert f"the last checkpoint is after round {done} of {rounds}" in lines[0], lines[0]
    run.lock()  # the lock was released
    run.unlock()

    command = shlex.split(lines[0].split("resume from it with: ", 1)[1])
    assert command[:3] == [sys.executable, "-m", "fedpriv.simulate"], command
    assert "resume=true" in command and f"run_dir={run_dir}" in command, command
    assert set(args) - {f"run_dir={run_dir}"} <= set(command), command
    # the printed command, run as `python -m fedpriv.simulate ...` in a fresh process forked warm (its import cost is
    # not the claim; tests/test_first_hour.py resumes from SIGTERM's pasted line in a fresh interpreter)
    resumed = run_module("fedpriv.simulate", *command[3:], cwd=ROOT, env=_env(), timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{rounds} rounds [" in resumed.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == rounds


# --- 3. the accounting calculator prints only its result ----------------------------------------

def test_accounting_cli_prints_only_the_result():
    # docs/ACCOUNTING.md's example: dp_accounting's RDP code logs ~27 absl convergence warnings for it
    proc = run_module("fedpriv.accounting", "noise", "--target-epsilon", "8", "--sampling-rate", "0.0333",
                      "--rounds", "150", "--delta", "1e-5", "--json", cwd=ROOT, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["epsilon"] <= 8


# dp_accounting's warning when an RDP value is negative (numerically unstable events): kept on the console
NEGATIVE_RDP = ("from dp_accounting.rdp import rdp_privacy_accountant as rdp\n"
                "rdp.compute_epsilon([2.0], [-1.0], 1e-5)\n")


def test_the_plan_cli_prints_no_absl_line_and_keeps_dp_accountings_other_warnings():
    """Issue 52: ``python -m fedpriv.plan`` silenced absl's logger wholesale to hide dp_accounting's
    notes of excluded RDP orders, hiding its other warnings too. The notes are dropped where they are
    logged (the smoke plan's calibrations log dozens); a negative Renyi divergence still reads
    ``warning: ...`` on stderr after the CLI has run. Before: nothing reached stderr."""
    code = ("import runpy, sys\n"
            "from fedpriv.accounting import accountant\n"
            "dropped = []\n"
            "kept = accountant.EXCLUDED_ORDER_NOTE.filter\n"
            "accountant.EXCLUDED_ORDER_NOTE.filter = lambda record: kept(record) or dropped.append(record)\n"
            "sys.argv = ['fedpriv.plan', '+experiment=smoke', 'plan.client_updates=400']\n"
            "runpy.run_module('fedpriv.plan', run_name='__main__', alter_sys=True)\n"
            "print('dropped', len(dropped))\n" + NEGATIVE_RDP)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("plan: cohort 8 x 50 rounds"), proc.stdout
    # (the smoke plan's own advice line, plan=auto's "well under non-private" warning, is not dp_accounting's)
    assert [line for line in proc.stderr.splitlines() if not line.startswith("warning: plan=auto:")] == [
        "warning: Negative Renyi divergence of -1.0, probably caused by numerical "
        "instability from extreme DpEvents. Returning an epsilon of zero."], proc.stderr
    assert int(proc.stdout.split("dropped ")[1]) > 0, proc.stdout  # the notes were logged, and dropped


def test_accounting_cli_plural(capsys):
    from fedpriv.accounting.__main__ import main

    for rounds, text in ((1, "1 round)"), (3, "3 rounds)")):
        assert main(["epsilon", "--noise-multiplier", "1", "--sampling-rate", "0.01", "--rounds", str(rounds),
                     "--delta", "1e-5"]) == 0
        assert capsys.readouterr().out.rstrip().endswith(text)


# --- 4. "1 round", "3 rounds" -----------------------------------------------------------------------

def _summary(rounds: int) -> dict:
    return {"final": {"accuracy": 0.1, "loss": 4.0}, "rounds": rounds, "privacy_unit": "user",
            "privacy": {"epsilon": 2.0, "delta": 1e-5, "accountant": "rdp",
                        "neighboring_relation": "add_or_remove_one", "noise_multiplier": 1.0,
                        "randomness": {"mode": "research", "note": "reproducible"}}}


@pytest.mark.parametrize("rounds, text", [(1, ", 1 round ["), (3, ", 3 rounds ["), (0, ", 0 rounds [")])
def test_result_line_plural(rounds, text):
    from fedpriv.release.result_lines import format_result

    assert text in format_result(_summary(rounds))


# --- 5. sweep.png: epsilon ticks that never overprint --------------------------------------------

def test_epsilon_ticks_round_and_drop_close_values():
    from fedpriv.report import epsilon_ticks

    positions, labels = epsilon_ticks([9.999, 10.0, 1.9998, 4.0001, 7.999, 7.999])
    assert labels == ["2", "4", "8", "10"]
    assert positions == [1.9998, 4.0001, 7.999, 9.999]
    assert epsilon_ticks([0.123456, 123.456])[1] == ["0.123", "123"]
    # two distinct budgets close on the axis (< 3% of its log span apart): one tick
    assert epsilon_ticks([1.0, 1.05, 100.0])[1] == ["1", "100"]
    assert epsilon_ticks([3.0])[1] == ["3"]
    assert epsilon_ticks([float("inf"), float("nan")]) == ([], [])


def test_sweep_figure_uses_the_deduplicated_ticks():
    from fedpriv.report import _pyplot, sweep_figure

    rows = [{"privacy.target_epsilon": t, "final_accuracy": 0.1 + 0.01 * i, "epsilon": e, "non_private": False,
             "mode": "research"} for i, (t, e) in enumerate([(10, 9.999), (10.001, 10.0), (2, 1.9998)])]
    fig = sweep_figure(["privacy.target_epsilon"], rows)
    try:
        labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
        assert labels == ["2", "10"]
    finally:
        _pyplot().close(fig)
