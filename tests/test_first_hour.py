"""What a new user runs into first (issue "the first hour of a new user"): no silent wrong runs,
sweeps checked up front, Hydra's errors translated into one line that says what to do, an empty
run_dir refused, a resume line that works when pasted, SIGTERM handled like Ctrl-C."""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, compose_cfg
from fedpriv.config.compose import check_overrides
from fedpriv.plan import preflight_sweep
from fedpriv.errors import ConfigError


def _one_error_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr[-2000:]
    return lines[0]


# --- 1. a key of another option is refused, naming the option that has it ---------------------------

def test_a_data_path_without_its_dataset_is_refused_naming_the_dataset(tmp_path, run_cli):
    out = tmp_path / "run"
    line = _one_error_line(run_cli("data.path=stackoverflow.sqlite", "rounds=2", f"run_dir={out}"))
    assert "data=synthetic" in line and "it is a key of data=files, stackoverflow" in line
    assert not out.exists()


@pytest.mark.parametrize("overrides, expected", [
    (["+experiment=smoke", "model=transformer_tiny", "model.hidden_size=64"],
     "'model.hidden_size' is not a key of model=transformer_tiny; it is a key of model=lstm, lstm_tiny"),
    (["+experiment=smoke", "data.path=/nonexistent/file.sqlite"], "it is a key of data=files, stackoverflow"),
    (["+experiment=smoke", "mechanism.bands=4"], "not a key of mechanism=gaussian; it is a key of mechanism=bandmf"),
])
def test_a_key_of_another_option_names_the_options_that_have_it(overrides, expected):
    with pytest.raises(ConfigError) as err:
        check_overrides(overrides)
    assert expected in str(err.value)


# --- 2. a fixed noise multiplier and a target epsilon ---------------------------------------------

def test_a_noise_multiplier_and_a_target_epsilon_together_are_refused(tmp_path, run_cli):
    out = tmp_path / "run"
    line = _one_error_line(run_cli("+experiment=smoke", "privacy.noise_multiplier=1.0", "privacy.target_epsilon=2",
                                   f"run_dir={out}"))
    assert "privacy.noise_multiplier=1.0" in line and "privacy.target_epsilon=2" in line
    assert not out.exists()


def test_a_noise_multiplier_beside_the_experiments_target_says_the_target_is_not_used(tmp_path, caplog):
    from fedpriv.runner import prepare

    with caplog.at_level(logging.WARNING, logger="fedpriv"):
        session = prepare(compose_cfg("+experiment=smoke", "privacy.noise_multiplier=1.0", run_dir=tmp_path / "run"))
    assert session.ledger.noise_multiplier == 1.0
    assert any("is used as given: the target epsilon 50 " in r.getMessage() for r in caplog.records)
    session.run.unlock()


# --- 3. sweeps: every member checked before the first runs; defaults fitted to the population ------

def test_a_sweep_member_that_cannot_run_stops_the_sweep_before_any_member_runs(tmp_path, run_cli):
    sweep = tmp_path / "sweep"
    line = _one_error_line(run_cli("-m", "+experiment=smoke", "cohort_size=8,50", f"hydra.sweep.dir={sweep}"))
    assert "sweep member cohort_size=50" in line and "exceeds the population of 40" in line
    assert not sweep.exists()


def test_a_key_of_one_option_in_a_mixed_sweep_says_to_run_one_sweep_per_option():
    # and names the guide whose section shows how (tests/test_docs.py checks that the section exists)
    with pytest.raises(ConfigError, match=re.escape("run one sweep per mechanism option "
                                                    "(docs/EXPERIMENTS.md, 'Sweeps and reports')")):
        check_overrides(["+experiment=smoke", "mechanism=gaussian,bandmf", "mechanism.bands=4"], multirun=True)


def test_a_sweep_checks_the_sampler_and_mechanism_of_every_member():
    # sampling=poisson cannot account BandMF: member 2 is refused before member 1 runs
    with pytest.raises(ConfigError, match="sweep member mechanism=bandmf"):
        preflight_sweep(check_overrides(["+experiment=smoke", "mechanism=gaussian,bandmf", "sampling=poisson"],
                                        multirun=True))


def test_bandmf_default_bands_fit_a_small_population_and_the_run_says_so(tmp_path, caplog):
    from fedpriv.runner import prepare

    with caplog.at_level(logging.WARNING, logger="fedpriv"):
        session = prepare(compose_cfg("+experiment=smoke", "rounds=10", "mechanism=bandmf", run_dir=tmp_path / "r"))
    # 40 users in cohorts of 8: five cyclic-Poisson groups at most
    assert session.spec.mechanism.bands == 5 and session.cfg["mechanism"]["bands"] == 5
    assert session.server.sampler.groups == 5
    assert any("mechanism.bands=16 does not fit" in r.getMessage() and "using 5" in r.getMessage()
               for r in caplog.records)
    session.run.unlock()


def test_explicit_bandmf_bands_that_cannot_fit_are_refused_with_the_largest_that_fits(tmp_path):
    from fedpriv.runner import prepare

    with pytest.raises(ConfigError, match=r"the largest that fits: 5\)"):
        prepare(compose_cfg("+experiment=smoke", "rounds=10", "mechanism=bandmf", "mechanism.bands=8",
                            run_dir=tmp_path / "r"))
    assert not (tmp_path / "r").exists()


# --- 4. an empty run_dir ------------------------------------------------------------------------------

def test_an_empty_run_dir_is_refused_and_nothing_is_written_in_the_current_directory(run_cli):
    before = sorted(os.listdir(ROOT))
    line = _one_error_line(run_cli("+experiment=smoke", "run_dir="))
    assert "run_dir is empty" in line
    assert sorted(os.listdir(ROOT)) == before


# --- 5. the resume line and SIGTERM -------------------------------------------------------------------

def test_the_resume_line_names_the_interpreter_that_ran_and_quotes_what_needs_quoting(tmp_path):
    from fedpriv.release.console import interrupted_message
    from fedpriv.release.rundir import RunDirectory

    line = interrupted_message(RunDirectory(tmp_path / "a b"), ["+experiment=[smoke,distill]", "rounds=3"])
    command = line.split("start again with: ", 1)[1]
    assert shlex.split(command) == [sys.executable, "-m", "fedpriv.simulate", "+experiment=[smoke,distill]",
                                    "rounds=3", f"run_dir={tmp_path / 'a b'}"]


def test_sigterm_checkpoints_prints_one_line_and_the_pasted_line_resumes(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    args = [sys.executable, "-m", "fedpriv.simulate", "+experiment=smoke", "rounds=30", "eval_every=30",
            "progress=false", f"run_dir={out}"]
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoints" / "last.pt").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr[-2000:]
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "resume from it with: " in lines[0], stderr[-2000:]
    resume = shlex.split(lines[0].split("resume from it with: ", 1)[1])
    assert resume[0] == sys.executable
    done = subprocess.run(resume, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "summary.json").exists()


# --- 7. Hydra's own errors, translated ----------------------------------------------------------------

@pytest.mark.parametrize("args, expected", [
    (["experiment=smoke"], "add it with a plus, +experiment=NAME"),
    (["--rounds", "5"], "settings are key=value overrides, e.g. rounds=5"),
    (["+experiment=smoke", "+experiment=distill"], "+experiment=[smoke,distill]"),
    (["+experiment=smoke", "rounds=5,6"], "add -m"),
])
def test_hydra_errors_become_one_line_that_says_what_to_do(args, expected):
    with pytest.raises(ConfigError) as err:
        check_overrides(args)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_a_flag_that_is_not_hydras_is_one_error_line_from_the_real_command(run_cli):
    line = _one_error_line(run_cli("--rounds", "5"))
    assert "rounds=5" in line


def test_the_fixes_the_messages_suggest_are_accepted():
    check_overrides(["+experiment=smoke", "model=lstm", "model.hidden_size=64"])
    check_overrides(["+experiment=smoke", "data=stackoverflow", "data.path=x.sqlite"])
    check_overrides(["+experiment=[smoke,distill]"])
    check_overrides(["rounds=5"])
