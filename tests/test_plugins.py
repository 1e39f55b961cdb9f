"""The contract tests of every extension point, parametrised over the registries: every registered
option — the built-in ones and any registered later (a module of fedpriv, or a ``tests/plugin_*.py``
file, which conftest.py imports before collection) — gets them without writing any.

* mechanisms: it builds; for every sampler it states a relation and a DpEvent, or refuses both
  (fail closed); its DpEvent follows σ, at its own σ and at the σ it would be built with, so that
  calibration hits the target; its checkpoint continues the same noise; a round of the smoke run;
* samplers: cohorts are sorted, distinct, in range and a function of (key, round); some mechanism
  accounts them; the rate matches ``expected_cohort``;
* server optimizers, algorithms, models, datasets: they build what their group's contract names,
  a checkpoint round-trip (optimizers), the model's shape and Book-Keeping's support, a round of the
  smoke run with the option selected.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from fedpriv import schema
from fedpriv.accounting import calibrate_noise_multiplier, compute_epsilon
from fedpriv.accounting.monte_carlo import MonteCarloDpEvent, MonteCarloSettings
from fedpriv.errors import ConfigError
from fedpriv.mechanisms.base import NoiseMechanism
from fedpriv.optim.base import ServerOptimizerBase
from fedpriv.keys.research_key import key_from_seed, noise_from_seed
from fedpriv.sampling import SAMPLERS, Sampler, make_sampler
from fedpriv.schema import options
from tests.conftest import compose_cfg
from tests.helpers import run_dir_files

ROUNDS = 32
DIMENSION = 1000  # the trained parameters a mechanism sized by them (ddgauss) is built for
POPULATION = 64
COHORT = 4


MC_SETTINGS = MonteCarloSettings(samples=20_000)  # Monte-Carlo events: a quick claim at delta 1e-3


def _accounted_epsilon(event, relation) -> float:
    """ε of an event with the accountant that interprets it: Monte Carlo for its events (at
    δ = 1e-3, which few samples resolve), RDP otherwise (δ = 1e-5)."""
    if isinstance(event, MonteCarloDpEvent):
        return compute_epsilon(event, 1e-3, "mc", relation, monte_carlo_settings=MC_SETTINGS)
    return compute_epsilon(event, 1e-5, "rdp", relation)


def _names(group: str) -> list[str]:
    return sorted(options(group))


def _samplers(option) -> dict[str, Sampler]:
    """One sampler of every registered kind (accounting only: no key)."""
    out = {}
    for kind in sorted(SAMPLERS):
        try:
            out[kind] = make_sampler(kind, POPULATION, COHORT, None, groups=option.sampling_groups() or 2)
        except ConfigError:
            continue
    return out


def _smoke_round(tmp_path, *overrides: str, rounds: int = 2) -> dict:
    """``rounds`` rounds of the smoke run with ``overrides``, in process; its summary."""
    from fedpriv.runner import prepare
    from server.app import run_local

    cfg = compose_cfg("+experiment=smoke", f"rounds={rounds}", f"eval_every={rounds}", "progress=false",
                      "cohort_size=2", *overrides, run_dir=tmp_path / "run")
    session = prepare(cfg)
    summary = run_local(session)
    assert summary["rounds"] == rounds and math.isfinite(summary["final"]["loss"])
    assert run_dir_files(tmp_path / "run") == set(session.plan.outputs)  # the option writes what it declares
    return summary


# --- the registry itself ---------------------------------------------------------------------------

@pytest.mark.parametrize("group", schema.GROUPS)
def test_every_registered_option_meets_its_group_base(group):
    for name, option in options(group).items():
        assert isinstance(option, schema.GROUP_BASES[group]), (group, name)
        option.check(group)  # its own defaults pass its own checks


def test_register_option_refuses_an_option_that_breaks_its_contract():
    @dataclasses.dataclass
    class NoBuild(schema.MechanismOption):  # build is abstract
        default_sampling = "poisson"
        name: str = "no_build"

    @dataclasses.dataclass
    class WrongGroup(schema.OptimizerOption):
        name: str = "wrong"

        def build(self, rounds=None):
            return None

    with pytest.raises(TypeError, match="build"):
        schema.register_option("mechanism", "no_build", object.__new__(NoBuild))
    with pytest.raises(TypeError, match="MechanismOption"):
        schema.register_option("mechanism", "wrong", WrongGroup())
    assert "no_build" not in options("mechanism") and "wrong" not in options("mechanism")


# --- mechanisms ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", _names("mechanism"))
def test_mechanism_builds_and_states_its_accounting_or_refuses(name):
    option = options("mechanism")[name]
    accountable = []
    for kind, sampler in _samplers(option).items():
        mech = option.build(1.0, 1.0, rounds=ROUNDS, sampler=sampler, dimension=DIMENSION)
        assert isinstance(mech, NoiseMechanism)
        try:
            relation = mech.neighboring_relation(sampler)
        except ConfigError:
            with pytest.raises(ConfigError):  # fail closed: no relation, no event
                mech.dp_event(sampler, ROUNDS)
            continue
        eps = _accounted_epsilon(mech.dp_event(sampler, ROUNDS), relation)
        assert 0 < eps < math.inf, (kind, eps)
        assert isinstance(mech.accounting_details(sampler, ROUNDS), dict)
        accountable.append(kind)
    assert option.default_sampling in accountable


@pytest.mark.parametrize("name", _names("mechanism"))
def test_mechanism_fitted_to_a_small_population_is_an_option_of_its_kind_that_builds(name):
    """``fitted`` (defaults that cannot fit replaced) returns the same kind of option, is stable
    when applied again, and its build is accounted with the option's default sampler."""
    from fedpriv.sampling import make_sampler

    option = options("mechanism")[name]
    fitted = option.fitted(40, 8, 3, option.default_sampling)
    assert type(fitted) is type(option)
    assert fitted.fitted(40, 8, 3, option.default_sampling) == fitted
    sampler = make_sampler(option.default_sampling, 40, 8, None, groups=fitted.sampling_groups())
    mech = fitted.build(1.0, 1.0, rounds=3, sampler=sampler, dimension=DIMENSION)
    assert compute_epsilon(mech.dp_event(sampler, 3), 1e-5, "rdp", mech.neighboring_relation(sampler)) < math.inf


@pytest.mark.parametrize("name", _names("mechanism"))
def test_mechanism_calibrates_to_its_target(name):
    """Calibration searches over ``dp_event(noise_multiplier=s)`` of an accounting build; the
    mechanism then built with the σ found must spend exactly the target (its own event)."""
    option = options("mechanism")[name]
    sampler = _samplers(option)[option.default_sampling]
    accounting = option.build(1.0, 1.0, rounds=ROUNDS, sampler=sampler, dimension=DIMENSION)
    relation = accounting.neighboring_relation(sampler)

    def epsilon(event):
        return compute_epsilon(event, 1e-5, "rdp", relation)

    assert epsilon(accounting.dp_event(sampler, ROUNDS, noise_multiplier=0.8)) > epsilon(
        accounting.dp_event(sampler, ROUNDS, noise_multiplier=1.6))
    sigma = calibrate_noise_multiplier(lambda s: accounting.dp_event(sampler, ROUNDS, noise_multiplier=s),
                                       4.0, 1e-5, "rdp", relation)
    built = option.build(sigma, 1.0, rounds=ROUNDS, sampler=sampler, dimension=DIMENSION)
    assert epsilon(built.dp_event(sampler, ROUNDS)) == pytest.approx(4.0, rel=2e-3)
    assert epsilon(built.dp_event(sampler, ROUNDS)) == pytest.approx(
        epsilon(accounting.dp_event(sampler, ROUNDS, noise_multiplier=sigma)), rel=1e-9)


@pytest.mark.parametrize("name", _names("mechanism"))
def test_mechanism_checkpoint_continues_the_same_noise(name):
    option = options("mechanism")[name]
    sampler = _samplers(option)[option.default_sampling]

    def build():
        return option.build(0.7, 2.0, noise=noise_from_seed(3), rounds=ROUNDS, sampler=sampler, dimension=DIMENSION)

    first, reference = build(), build()
    for t in range(3):
        torch.testing.assert_close(first.noise(t, (5,)), reference.noise(t, (5,)), rtol=0, atol=0)
    resumed = build()
    resumed.load_state_dict(first.state_dict())
    torch.testing.assert_close(resumed.noise(3, (5,)), reference.noise(3, (5,)), rtol=0, atol=0)
    assert tuple(first.matrix(4).shape)[0] == 4


@pytest.mark.parametrize("name", _names("mechanism"))
def test_mechanism_runs_a_round_of_smoke(tmp_path, name):
    _smoke_round(tmp_path, f"mechanism={name}", "sampling=auto", rounds=16)  # BandMF's 16 bands need 16 rounds


# --- samplers --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_sampler_draws_cohorts_a_mechanism_accounts(kind):
    key = key_from_seed(1)
    sampler = make_sampler(kind, POPULATION, COHORT, key, groups=2)
    assert isinstance(sampler, Sampler) and sampler.kind == kind and sampler.expected_cohort > 0
    sizes = []
    for t in range(40):
        cohort = sampler.sample(t)
        assert cohort.dtype == np.int64 and np.all(np.diff(cohort) > 0)
        assert cohort.size == 0 or (cohort[0] >= 0 and cohort[-1] < POPULATION)
        np.testing.assert_array_equal(cohort, make_sampler(kind, POPULATION, COHORT, key, groups=2).sample(t))
        sizes.append(cohort.size)
    assert abs(np.mean(sizes) - sampler.expected_cohort) < 0.5 * sampler.expected_cohort
    accounted = []
    for name in _names("mechanism"):  # with the sampler's groups that mechanism implies (BandMF: its bands)
        option = options("mechanism")[name]
        own = _samplers(option).get(kind)
        if own is None:
            continue
        try:
            option.build(1.0, 1.0, rounds=ROUNDS, sampler=own, dimension=DIMENSION).neighboring_relation(own)
            accounted.append(name)
        except ConfigError:
            pass
    assert accounted, f"no registered mechanism accounts sampling={kind}"


# --- server optimizers -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", _names("optimizer"))
def test_optimizer_builds_steps_and_checkpoints(name):
    from fedpriv.round.queries import RoundRelease

    option = options("optimizer")[name]
    opt, twin = option.build(ROUNDS), option.build(ROUNDS)
    assert isinstance(opt, ServerOptimizerBase)
    plan = opt.query_plan
    gen = torch.Generator().manual_seed(0)
    params = torch.randn(6, generator=gen)

    def release() -> RoundRelease:  # what the round hands the optimizer under its declared plan
        u = torch.randn(6, generator=gen)
        return RoundRelease(update=u, noise_std=0.1 if plan.noise_std else None,
                            squares=u * u if plan.squares else None, noiseless=u if plan.noiseless else None)

    for r in (release(), release()):
        params, stats = opt.step_release(params, r)
        assert params.shape == (6,) and torch.isfinite(params).all() and isinstance(stats, dict)
    twin.load_state_dict(opt.state_dict())
    last = release()
    torch.testing.assert_close(twin.step_release(params, last)[0], opt.step_release(params, last)[0],
                               rtol=0, atol=0)


@pytest.mark.parametrize("name", _names("optimizer"))
def test_optimizer_runs_a_round_of_smoke(tmp_path, name):
    _smoke_round(tmp_path, f"optimizer={name}")


# --- algorithms, models, datasets ------------------------------------------------------------------

@pytest.mark.parametrize("name", _names("algorithm"))
def test_algorithm_builds_and_runs_a_round_of_smoke(tmp_path, name):
    from fedpriv.round.algorithms import Algorithm

    option = options("algorithm")[name]
    assert isinstance(option.build(schema.Client()), Algorithm)
    _smoke_round(tmp_path, f"algorithm={name}")


@pytest.mark.parametrize("name", _names("model"))
def test_model_builds_under_book_keeping_and_runs_a_round_of_smoke(tmp_path, name):
    from fedpriv.clipping import BookKeeping

    from fedpriv.config.resolve import run_config
    from fedpriv.task import load_dataset

    overrides = options("model")[name].example_overrides(tmp_path)
    spec = run_config(compose_cfg("+experiment=smoke", f"model={name}", *overrides, run_dir=tmp_path / "x"))
    option = spec.model
    # a model whose ids are its own tokenizer's is built for that tokenizer, as a run builds it
    vocab = load_dataset(schema.as_dict(spec.data)).vocab.size if option.tokenizer else 50
    model = option.build_model(vocab, 0, 6)
    assert isinstance(model, torch.nn.Module)
    tokens = torch.randint(1, 50, (3, 6), generator=torch.Generator().manual_seed(0))
    assert tuple(model(tokens).shape) == (3, 6, vocab)
    BookKeeping(model, clip_norm=1.0, noise_multiplier=0.0, noise_key=b"\0" * 32)  # every layer supported
    _smoke_round(tmp_path, f"model={name}", *overrides)


@pytest.mark.parametrize("name", _names("data"))
def test_dataset_loads_and_runs_a_planned_audited_smoke_run(tmp_path, name):
    """The dataset under every consumer of the word rows: ``plan=auto`` with a stated public
    population (the planner), an audit of 2 canaries, and the degradation verdict in summary.json
    (its unigram baseline where the dataset publishes one)."""
    from fedpriv.data.federated import FederatedDataset

    overrides = options("data")[name].example_overrides(tmp_path)
    cfg = compose_cfg("+experiment=smoke", f"data={name}", *overrides, run_dir=tmp_path / "x")
    data = schema.load("data", cfg["data"]).load_words()
    assert isinstance(data, FederatedDataset) and len(data.users) > 0
    summary = _smoke_round(tmp_path, f"data={name}", *overrides, "plan=auto", f"population={POPULATION}",
                           "plan.client_updates=400", "audit.canaries=2", rounds=50)
    assert summary["plan"]["population"] == POPULATION and summary["unigram_accuracy"] == data.unigram_accuracy
    assert isinstance(summary["degraded"], bool)
    if summary["degraded"]:
        verdict = summary["degradation"]
        assert verdict["cause"] and verdict["fix"] and verdict["unigram"] == data.unigram_accuracy
    assert summary["audit"]["canaries"] == 2 and (tmp_path / "run" / "audit_scores.json").is_file()


@pytest.mark.parametrize("name", _names("data"))
def test_dataset_trains_a_hugging_face_model_under_book_keeping(tmp_path, name):
    """``model=hf`` (its tokenizer re-encodes the dataset's text) with example-level DP-SGD on the
    clients (Book-Keeping): a tiny Llama whose word tokenizer holds the dataset's words."""
    from fedpriv.models.tiny_hf import write_model_dir

    overrides = options("data")[name].example_overrides(tmp_path)
    cfg = compose_cfg("+experiment=smoke", f"data={name}", *overrides, run_dir=tmp_path / "x")
    words = schema.load("data", cfg["data"]).load_words().vocab.words
    model = write_model_dir(tmp_path / "hf_llama", words, "llama", hidden=32, layers=2, heads=4)
    summary = _smoke_round(tmp_path, f"data={name}", *overrides, "model=hf", f"model.path={model}",
                           "data.tokenizer=hf", "client.dp=example")
    assert summary["model"] == "hf" and summary["example_privacy"]["epsilon"] is not None
    assert (tmp_path / "run" / "hf_model" / "tokenizer.json").is_file()  # the release carries the tokenizer
