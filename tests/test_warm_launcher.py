"""The tests' warm launcher (tests/warm_launcher.py) gives what a fresh ``python -m`` gives: exit code,
output, working directory, environment, a timeout that kills the command, and a fedpriv imported
fresh (not the options this pytest process registered)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.warm_launcher import run_module


def _fresh(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, **kw)


def test_a_refusal_reads_as_in_a_fresh_interpreter():
    args = ("fedpriv.simulate", "+experiment=smoke", "mechanism=nonexistent")
    warm, fresh = run_module(*args, cwd=ROOT), _fresh(*args, cwd=ROOT)
    assert (warm.returncode, warm.stdout, warm.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert warm.returncode == 2 and warm.stderr.startswith("error: unknown mechanism 'nonexistent'")


def test_the_child_imports_fedpriv_fresh():
    # this pytest process registered tests/plugin_scaled_gaussian.py's mechanism; a command never sees it
    from fedpriv import schema

    assert "scaled_gaussian" in schema.options("mechanism")
    done = run_module("fedpriv.simulate", "+experiment=smoke", "mechanism=scaled_gaussian", cwd=ROOT)
    assert done.returncode == 2 and "unknown mechanism 'scaled_gaussian'" in done.stderr


def test_cwd_environment_exit_codes_and_tracebacks(tmp_path):
    (tmp_path / "probe.py").write_text(
        "import os, sys\nprint(os.getcwd(), os.environ['PROBE'], sys.argv[1:])\n"
        "sys.stderr.write('to stderr\\n')\nraise SystemExit(int(sys.argv[1]))\n")
    env = {**os.environ, "PROBE": "seen", "PYTHONPATH": str(tmp_path)}
    done = run_module("probe", "7", cwd=tmp_path, env=env)
    assert done.returncode == 7 and done.stdout == f"{tmp_path} seen ['7']\n" and done.stderr == "to stderr\n"
    (tmp_path / "boom.py").write_text("raise ValueError('boom')\n")
    done = run_module("boom", cwd=tmp_path, env=env)
    assert done.returncode == 1 and done.stderr.rstrip().endswith("ValueError: boom")


def test_a_timeout_kills_the_command(tmp_path):
    (tmp_path / "sleeper.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    with pytest.raises(subprocess.TimeoutExpired) as stopped:
        run_module("sleeper", cwd=tmp_path, env=env, timeout=3)
    assert stopped.value.output == "started\n"
    (tmp_path / "quick.py").write_text("print('next')\n")
    assert run_module("quick", cwd=tmp_path, env=env).stdout == "next\n"  # the launcher goes on after a kill
