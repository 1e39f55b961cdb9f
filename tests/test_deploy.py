"""A real Flower deployment on loopback (scripts/deploy_local.sh): SuperLink + SuperNodes +
`flwr run`, with and without TLS; equivalence with the in-process backend; a SuperNode killed
mid-run; every started process stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedpriv.release.rundir import RunDirectory
from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "deploy_local.sh"
pytestmark = pytest.mark.skipif(not (Path(sys.executable).parent / "flower-superlink").exists(),
                                reason="flower-superlink is not installed beside this Python")


def _env() -> dict:
    return {**os.environ, "FEDPRIV_VENV_BIN": str(Path(sys.executable).parent)}


def deploy(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    """The script, bounded by its own opt-in ``--timeout`` (so that it stops what it started) within
    ``timeout`` seconds: a test never hangs."""
    return subprocess.run(["bash", str(SCRIPT), "--timeout", str(int(timeout) - 30), *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def started_pids(out: Path) -> dict[str, int]:
    return {name: int(pid) for name, pid in (line.split() for line in (out / "logs" / "pids").read_text().splitlines())}


def assert_all_stopped(out: Path) -> None:
    """No process is left in any process group the script started (each job leads its own group)."""
    for name, pid in started_pids(out).items():
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            continue
        pytest.fail(f"{name} (process group {pid}) is still running")


def test_deployed_run_over_tls_equals_in_process_run(tmp_path):
    """Over TLS, research mode (asked for explicitly: deployments default to secure) reproduces the
    in-process run bit for bit."""
    out = tmp_path / "deploy"
    proc = deploy("--clients", "2", "--rounds", "2", "--out", str(out), "--tls", "--", "privacy.secure_rng=false")
    assert proc.returncode == 0, proc.stderr + (out / "logs" / "flwr-run.log").read_text()[-3000:]
    assert_all_stopped(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["backend"] == "deployment"
    assert summary["privacy"]["randomness"]["mode"] == "research"
    assert "running on https://127.0.0.1" in (out / "logs" / "superlink.log").read_text()
    assert (out / "checkpoints" / "last.pt").stat().st_mode & 0o077 == 0  # checkpoints are written owner-only
    # deployments compute no statistics of training users, in any mode
    assert not (out / "diagnostics.jsonl").exists() and "wall_s" not in summary
    rows = RunDirectory(out).read_metrics()
    assert all(set(row) <= {"round", "epsilon", "mode"} or "test_accuracy" in row for row in rows)
    # the same experiment in process
    from fedpriv.runner import prepare
    from server.app import run_local
    from tests.conftest import compose_cfg

    local = prepare(compose_cfg("+experiment=smoke", "rounds=2", "progress=false", run_dir=tmp_path / "local"))
    run_local(local)
    deployed = torch.load(out / "checkpoints" / "last.pt", weights_only=True)["server"]["params"]
    torch.testing.assert_close(deployed, local.server.params, rtol=0, atol=0)
    a = json.loads((out / "privacy.json").read_text())
    b = json.loads((tmp_path / "local" / "privacy.json").read_text())
    assert a == b


# slow (~40 s, a second deployment): the TLS run above is the same deployment with the transport
# encrypted; the secure default of a deployment's config is pinned in process by
# test_deployments_default_to_secure_mode
@pytest.mark.slow
def test_an_insecure_deployment_runs_in_secure_mode_by_default(tmp_path):
    out = tmp_path / "plain"
    proc = deploy("--clients", "2", "--rounds", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr + (out / "logs" / "flwr-run.log").read_text()[-3000:]
    assert_all_stopped(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2
    assert summary["privacy"]["randomness"]["mode"] == "secure"  # the deployment default
    assert "insecure" in (out / "logs" / "superlink.log").read_text().lower()
    assert (out / "checkpoints" / "last.pt").stat().st_mode & 0o077 == 0  # it holds the run key: owner-only
    # each SuperNode remembers the rounds it answered in its own state directory (its node config's state-dir)
    for k in range(2):
        marks = (out / "node-state" / f"supernode-{k}" / "answered").glob("*/round-*")
        assert sorted(mark.name for mark in marks) == ["round-1", "round-2"]


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", [(), ("--", "mechanism=ddgauss")])  # its parties: the 3 nodes
def test_a_deployment_aggregates_through_secagg_plus(tmp_path, mechanism):
    """--secagg: 3 SuperNodes, 2 rounds, each round's node sums (or, under mechanism=ddgauss, each
    party's message with its noise share) through Flower's SecAgg+ (the server's log says the
    protocol completed twice; the run keeps its claim)."""
    out = tmp_path / "secagg"
    proc = deploy("--clients", "3", "--rounds", "2", "--out", str(out), "--secagg", *mechanism)
    log = (out / "logs" / "flwr-run.log").read_text()
    assert proc.returncode == 0, proc.stderr + log[-3000:]
    assert_all_stopped(out)
    # Flower's own handler prints each event once (a root handler, when one is set, repeats it as INFO:flwr:...)
    assert sum("Secure aggregation completed." in line and not line.startswith("INFO:flwr:")
               for line in log.splitlines()) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["privacy"]["epsilon"] <= 50.0
    assert summary["privacy"]["mechanism"] == ("ddgauss" if mechanism else "gaussian")


def test_deployments_default_to_secure_mode(tmp_path):
    from fedpriv.config.compose import deployment_config
    from fedpriv.config.resolve import run_config
    from fedpriv.schema.run_config import secure_mode

    # the config a deployed run's server and clients compose (what deploy_local.sh passes to flwr run)
    def composed(overrides: str):
        return run_config(deployment_config({"experiment": "smoke", "overrides": overrides, "run-dir": str(tmp_path)}))

    deployed = composed("rounds=2")
    assert deployed.backend.name == "deployment" and deployed.secure is True
    assert composed("privacy.secure_rng=false").secure is False
    assert secure_mode(None, "deployment") is True
    assert secure_mode(None, "local") is False and secure_mode(None, "flower") is False
    assert secure_mode(False, "deployment") is False and secure_mode(True, "local") is True


def _deployed_server(tmp_path: Path, overrides: str) -> None:
    """The deployed ServerApp's ``main`` on the Flower run config ``scripts/deploy_local.sh`` would
    pass (experiment smoke, ``overrides``), up to where its round needs a grid (none here)."""
    from types import SimpleNamespace

    from server.deploy import main

    main(None, SimpleNamespace(run_config={"experiment": "smoke", "overrides": overrides,
                                           "run-dir": str(tmp_path / "r")}))


def test_a_deployed_run_refuses_a_setting_typed_beside_plan_auto_that_the_plan_replaces(tmp_path):
    """Issue 52: a deployment with ``overrides="plan=auto mechanism=tree"`` ran the plan's bandmf
    and dropped mechanism=tree without a word; the ServerApp now fails the run with the one line
    ``python -m fedpriv.simulate`` gives for the same settings, before its run directory is made."""
    from fedpriv.config.compose import check_overrides, deployment_config
    from fedpriv.errors import ConfigError
    from fedpriv.plan import preflight_sweep

    planned = "plan=auto plan.client_updates=1600"
    with pytest.raises(ConfigError) as simulated:  # what python -m fedpriv.simulate checks of its command line
        preflight_sweep(check_overrides(["+experiment=smoke", *planned.split(), "mechanism=tree"]))
    with pytest.raises(ConfigError) as deployed:
        _deployed_server(tmp_path, f"{planned} mechanism=tree")
    assert str(deployed.value) == str(simulated.value)
    assert "mechanism=tree (planned: bandmf)" in str(deployed.value) and "\n" not in str(deployed.value)
    assert not (tmp_path / "r").exists()
    # the plan alone passes, as composed for the clients
    from server.deploy import server_config

    run_config = {"experiment": "smoke", "overrides": planned, "run-dir": str(tmp_path / "r")}
    assert server_config(run_config) == deployment_config(run_config)


def test_the_deployed_server_leaves_dp_accountings_warnings_on(tmp_path, monkeypatch, caplog):
    """Issue 52: the ServerApp raised absl's logger to ERROR to hide dp_accounting's notes of
    excluded RDP orders (now dropped where they are logged), hiding its other warnings too."""
    import logging

    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    from fedpriv.errors import ConfigError

    monkeypatch.setattr(logging.getLogger("absl"), "level", logging.NOTSET)  # restored after
    with pytest.raises(ConfigError, match="rounds"):
        _deployed_server(tmp_path, "rounds=two")  # the server's setup ran, then its config was refused
    with caplog.at_level(logging.WARNING):
        rdp.compute_epsilon([2.0], [-1.0], 1e-5)
    assert [r.getMessage() for r in caplog.records if r.name == "absl"] == [
        "Negative Renyi divergence of -1.0, probably caused by numerical instability from extreme DpEvents. "
        "Returning an epsilon of zero."]


# slow (~100 s, a 45 s round timeout waited out): its round logic is pinned in process by
# tests/test_bad_updates.py::test_a_node_that_stops_replying_times_out_once_and_is_skipped, a real
# deployment by test_deployed_run_over_tls_equals_in_process_run
@pytest.mark.slow
def test_killed_supernode_round_finishes_within_the_timeout(tmp_path):
    """SIGKILL one of two SuperNodes after round 1: round 2 ends at its timeout with the dead
    node's users counted as dropped; later rounds skip that node (no second timeout); the run
    completes. The drop counts themselves are not published (they depend on the cohort)."""
    out = tmp_path / "kill"
    proc = subprocess.Popen(["bash", str(SCRIPT), "--clients", "2", "--rounds", "4", "--out", str(out),
                             "--round-timeout", "45", "--timeout", "600"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not RunDirectory(out).read_metrics():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "round 1 never finished"
            time.sleep(0.5)
        os.killpg(started_pids(out)["supernode-1"], signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr + (out / "logs" / "flwr-run.log").read_text()[-3000:]
    assert_all_stopped(out)
    rows = RunDirectory(out).read_metrics()
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert not any("dropped" in r for r in rows)
    log = (out / "logs" / "flwr-run.log").read_text()
    timeouts = [line for line in log.splitlines() if "did not reply within 45" in line]
    assert len(timeouts) == 1 and "round 2:" in timeouts[0]  # rounds 3 and 4 skip the dead node
    assert "its users count as dropped" in timeouts[0]  # no count of them: it depends on the cohort


def _stub_bin(tmp_path: Path) -> Path:
    """A FEDPRIV_VENV_BIN whose Flower commands are stand-ins: a SuperLink that answers its health
    check, SuperNodes that note their arguments and wait, and a ``flwr`` that notes which program
    started it and fails once both SuperNodes have started."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    stubs = {"flower-superlink": f"""#!{sys.executable}
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
""", "flower-supernode": "#!/bin/sh\necho \"$@\" >> \"$FLWR_STUB_NODES\"\nexec sleep 120\n",
             # flwr waits (up to 20 s) until both SuperNodes have noted their arguments: the script stops
             # them once flwr returns, and a loaded machine may not have run a node's first line by then
             "flwr": "#!/bin/sh\nfor i in $(seq 200); do [ \"$(cat \"$FLWR_STUB_NODES\" 2>/dev/null | wc -l)\" -ge 2 ] "
                     "&& break; sleep 0.1; done\ncat /proc/$PPID/comm > \"$FLWR_STUB_PARENT\"\nexit 1\n"}
    for name, text in stubs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("timeout,parent", [((), "bash"), (("--timeout", "50"), "timeout")])
def test_the_whole_run_deadline_is_opt_in(tmp_path, timeout, parent):
    """No deadline on the whole ``flwr run`` unless ``--timeout S`` asks for one: a deadline that
    fires stops the run after a number of rounds that depends on how long its data takes
    (docs/PRIVACY.md "Late nodes"). Stand-in Flower commands: ``flwr`` runs under ``timeout`` only
    when asked; the SuperNodes get their own state directories in their node config."""
    out, mark = tmp_path / "out", tmp_path / "parent"
    env = {**_env(), "FEDPRIV_VENV_BIN": str(_stub_bin(tmp_path)), "FLWR_STUB_PARENT": str(mark),
           "FLWR_STUB_NODES": str(tmp_path / "nodes")}
    proc = subprocess.run(["bash", str(SCRIPT), "--clients", "2", "--rounds", "1", "--out", str(out), *timeout],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "did not finish 1 rounds" in proc.stderr
    assert mark.read_text().strip() == parent
    assert_all_stopped(out)
    configs = sorted(line.split("--node-config ", 1)[1] for line in (tmp_path / "nodes").read_text().splitlines())
    assert configs == [f"partition-id={k} num-partitions=2 state-dir='{out}/node-state/supernode-{k}'" for k in (0, 1)]


@pytest.mark.parametrize("args,message", [(("--clients", "0", "--rounds", "2", "--out", "x"), "--clients"),
                                          (("--clients", "2", "--rounds", "two", "--out", "x"), "--rounds"),
                                          (("--clients", "2", "--rounds", "2"), "--out"),
                                          (("--clients", "2", "--rounds", "2", "--out", "x", "--bogus"), "--bogus"),
                                          (("--clients", "1", "--rounds", "2", "--out", "x", "--secagg"),
                                           "--secagg needs at least 2 clients"),
                                          (("--clients", "2", "--rounds", "2", "--out", "x", "--experiment", "nope"),
                                           "experiment"),
                                          (("--clients", "2", "--rounds", "2", "--out", "x", "--timeout", "0"),
                                           "--timeout must be a positive integer"),
                                          (("--clients", "2", "--rounds", "2", "--out", "x", "--node-state", "a'b"),
                                           "--node-state must not contain a single quote")])
def test_bad_arguments_exit_2(tmp_path, args, message):
    proc = deploy(*[str(tmp_path / a) if a == "x" else a for a in args], timeout=60)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_simulate_refuses_the_deployment_backend(run_cli, tmp_path):
    proc = run_cli("+experiment=smoke", "backend=deployment", f"run_dir={tmp_path / 'r'}")
    assert proc.returncode == 2 and "deploy_local.sh (docs/DEPLOYMENT.md)" in proc.stderr  # the guide that shows how
    assert not (tmp_path / "r").exists()
