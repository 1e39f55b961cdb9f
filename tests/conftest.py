import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


@pytest.fixture
def run_cli():
    """Run ``python -m fedpriv.simulate ARGS`` in the repo root; returns the CompletedProcess."""
    import subprocess

    def _run(*args: str, timeout: float = 300):
        env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
        return subprocess.run([sys.executable, "-m", "fedpriv.simulate", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)

    return _run


def compose_cfg(*overrides: str, run_dir) -> dict:
    """The resolved config dict that ``python -m fedpriv.simulate OVERRIDES`` would run."""
    from fedpriv.compose import compose_config

    return compose_config(overrides, run_dir)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Strategy caches (BandMF) go to a temporary directory, never the user's ~/.cache."""
    if "FEDPRIV_CACHE" not in os.environ:
        os.environ["FEDPRIV_CACHE"] = str(tmp_path_factory.mktemp("fedpriv-cache"))
    yield
