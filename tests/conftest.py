import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

# One torch thread for the whole suite, once, here: float reductions depend on the thread count
# (tests/golden/ was frozen on one), the models are tiny (one thread is faster), and under
# pytest-xdist (`make test`: one worker per core) more threads would only oversubscribe the
# cores. The variables reach the processes the tests start (CLI runs, deployments, Ray workers)
# and are set before torch is imported. Tests that need other counts set them and restore 1
# (tests/test_clipping.py).
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import torch  # noqa: E402  (after the variables above)

torch.set_num_threads(1)


def _import_test_plugins() -> None:
    """Options registered from test files (``tests/plugin_*.py``), imported before collection so
    that tests/test_plugins.py, parametrised over the registry, gives them its contract tests."""
    import importlib

    for path in sorted(Path(__file__).parent.glob("plugin_*.py")):
        importlib.import_module(f"tests.{path.stem}")


_import_test_plugins()


@pytest.fixture
def run_cli():
    """Run ``python -m fedpriv.simulate ARGS`` in the repo root, in a fresh process
    (tests/warm_launcher.py); returns the CompletedProcess."""
    from tests.warm_launcher import run_module

    def _run(*args: str, timeout: float = 300):
        env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
        return run_module("fedpriv.simulate", *args, cwd=ROOT, env=env, timeout=timeout)

    return _run


def compose_cfg(*overrides: str, run_dir) -> dict:
    """The resolved config dict that ``python -m fedpriv.simulate OVERRIDES`` would run."""
    from fedpriv.config.compose import compose_config

    return compose_config(overrides, run_dir)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Computed artifacts (BandMF/BLT strategies, Monte-Carlo calibrations, teachers, pre-training)
    go to a temporary directory, never the user's ~/.cache. Under pytest-xdist the workers share one
    (beside their own temporary directories): a plan=auto choice or a strategy that tests on both
    workers need is computed once per suite instead of once per worker. Every entry is keyed by all
    its inputs, written atomically and checked when read, as the cache is between concurrent runs;
    the tests about the cache itself set their own ``FEDPRIV_CACHE``."""
    if "FEDPRIV_CACHE" not in os.environ:
        if os.environ.get("PYTEST_XDIST_WORKER"):
            shared = tmp_path_factory.getbasetemp().parent / "fedpriv-cache"
            shared.mkdir(exist_ok=True)
            os.environ["FEDPRIV_CACHE"] = str(shared)
        else:
            os.environ["FEDPRIV_CACHE"] = str(tmp_path_factory.mktemp("fedpriv-cache"))
    yield
