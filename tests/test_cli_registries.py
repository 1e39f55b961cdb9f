"""The CLIs list their options from the registries: a sampler registered with
``fedpriv.sampling.register_sampler`` and a mechanism registered with
``fedpriv.schema.register_option`` (tests/plugin_scaled_gaussian.py) are choices of
``python -m fedpriv.accounting`` and ``python -m fedpriv.mechanisms`` with no edit there, and the
calculator builds the plugin sampler through the sampler registry (``make_sampler``)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from fedpriv import sampling
from fedpriv.accounting.__main__ import main as accounting_main
from fedpriv.mechanisms.__main__ import main as mechanisms_main
from fedpriv.schema import registry

PLUGIN = "plugin_poisson"


@dataclass(frozen=True)
class PluginPoissonSampler(sampling.PoissonSampler):
    """Poisson sampling under another name: a plugin's kind that the Gaussian mechanism accounts
    by its pattern (q = m/N with N the public population)."""

    kind: str = PLUGIN


@pytest.fixture
def plugin_sampler():
    """Register ``plugin_poisson`` for one test; the registries are restored afterwards."""
    saved = (dict(sampling.SAMPLERS), set(sampling.PUBLIC_RATE_KINDS), set(registry.SAMPLER_KINDS))

    @sampling.register_sampler(PLUGIN, public_rate=True)
    def _plugin(population, cohort_size, key, groups, public_population):
        return PluginPoissonSampler(population=population, rate=cohort_size / (public_population or population),
                                    key=key, public_population=public_population)

    yield
    sampling.SAMPLERS.clear()
    sampling.SAMPLERS.update(saved[0])
    sampling.PUBLIC_RATE_KINDS.clear()
    sampling.PUBLIC_RATE_KINDS.update(saved[1])
    registry.SAMPLER_KINDS.clear()
    registry.SAMPLER_KINDS.update(saved[2])


def _cli(main, capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", ["epsilon", "noise", "delta"])
def test_accounting_cli_lists_a_plugin_sampler(plugin_sampler, capsys, command):
    code, out, _ = _cli(accounting_main, capsys, command, "--help")
    assert code == 0
    assert f",{PLUGIN}}}" in out  # the --sampling choices, after the built-in kinds


def test_accounting_cli_builds_a_plugin_sampler_through_the_registry(plugin_sampler, capsys):
    """The plugin kind reads --population and --cohort; its epsilon is Poisson sampling's at q = m/N."""
    common = ("epsilon", "--noise-multiplier", "1.1", "--rounds", "50", "--delta", "1e-5", "--json")
    code, out, err = _cli(accounting_main, capsys, *common, "--sampling", PLUGIN, "--population", "1000",
                          "--cohort", "10")
    assert code == 0, err
    code, reference, err = _cli(accounting_main, capsys, *common, "--sampling-rate", str(10 / 1000))
    assert code == 0, err
    assert json.loads(out) == json.loads(reference)
    code, _, err = _cli(accounting_main, capsys, *common, "--sampling", PLUGIN, "--population", "1000")
    assert code == 2 and err == f"error: --sampling {PLUGIN} needs --population and --cohort\n"
    code, _, err = _cli(accounting_main, capsys, *common, "--sampling", PLUGIN, "--sampling-rate", "0.1")
    assert code == 2 and err.startswith("error: --sampling-rate does not apply to --sampling plugin_poisson")


def test_clis_list_a_plugin_mechanism(capsys):
    """tests/plugin_scaled_gaussian.py's mechanism (conftest.py registers it) is a choice of both CLIs."""
    code, out, _ = _cli(accounting_main, capsys, "epsilon", "--help")
    assert code == 0 and "scaled_gaussian" in out
    code, out, _ = _cli(mechanisms_main, capsys, "rmse", "--help")
    assert code == 0 and "scaled_gaussian" in out
