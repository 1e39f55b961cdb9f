"""Resolution and validation of a run's typed config. Every check raises ``ConfigError`` (one
line, exit 2) before anything is written; the per-field checks live with the types in
:mod:`fedpriv.schema`. :func:`run_config` is a run's one parse of its plain config; everything
after it reads the typed :class:`~fedpriv.schema.RunConfig`."""

from __future__ import annotations

import dataclasses
import logging

from fedpriv.devices import resolve_device
from fedpriv.errors import ConfigError
from fedpriv.schema import RunConfig, as_dict, complete, option_preset, parse
from fedpriv.sums import resolved_mechanism

log = logging.getLogger(__name__)


def run_config(cfg: dict) -> RunConfig:
    """The validated, resolved typed config of the plain ``cfg`` (:func:`validate`, then
    :func:`resolve`): the only parse of a run's config."""
    return resolve(validate(cfg))  # validated first: `secure_rng=abc` is an error, not a truthy value


def resolve(spec: RunConfig) -> RunConfig:
    """``spec`` with the values that mean "pick for me" resolved — ``sampling=auto`` (the mechanism's
    sampler), ``privacy.secure_rng=null`` (secure for deployments), what the mechanism leaves to the sum
    protocol (:meth:`~fedpriv.schema.SumOption.resolved_mechanism`: ddgauss's parties over SecAgg+) and, for
    ``model=hf`` with ``data.tokenizer=hf``, an unset ``data.tokenizer_path`` (``model.path``) — so
    that config.yaml (its plain form) names what the run does and server and clients derive the same
    research key. Idempotent."""
    data = spec.data
    if data.tokenizer == "hf" and not data.tokenizer_path and spec.model.name == "hf":
        data = dataclasses.replace(data, tokenizer_path=getattr(spec.model, "path", None))  # its tokenizer beside it
    return dataclasses.replace(spec, sampling=resolve_sampling(spec.sampling, spec.mechanism.name),
                               privacy=dataclasses.replace(spec.privacy, secure_rng=spec.secure), data=data,
                               mechanism=resolved_mechanism(spec))


def resolve_config(cfg: dict) -> dict:
    """The resolved plain form of ``cfg`` (:func:`run_config`): what config.yaml holds."""
    return as_dict(run_config(cfg))


def diagnostics_enabled(spec: RunConfig) -> bool:
    """Whether the run computes statistics of training users (``diagnostics.jsonl``): only in
    research mode, never in secure mode or a deployment, and only with ``diagnostics=true``."""
    return spec.diagnostics and not spec.secure and spec.backend.name != "deployment"


def client_diagnostics_enabled(spec: RunConfig) -> bool:
    """Whether clients report statistics of their data beside the delta (train loss, counts):
    with diagnostics, and never under example-level DP, whose replies carry the privatized delta
    and nothing else (the example-level guarantee is against the server too)."""
    return diagnostics_enabled(spec) and spec.client.dp != "example"


def validate(cfg: dict) -> RunConfig:
    """Check the parts of ``cfg`` that do not need the dataset — the typed schema
    (:func:`fedpriv.schema.parse`: unknown keys, types, ranges, unsupported combinations) — and
    add, in place, the schema's default for every key ``cfg`` lacks (a composed config lacks none;
    :func:`fedpriv.schema.complete`), so that config.yaml and the research key see every key."""
    parsed = parse(cfg)
    resolve_device(parsed.device)  # device=cuda without CUDA: refused here, before anything is written
    return complete(cfg, parsed)


def _larger_data(spec: RunConfig) -> str:
    """The data key that sets the population, where the chosen dataset has one (the synthetic
    generator's user count; StackOverflow's cap on users), as a hint for a cohort that is too large."""
    if hasattr(getattr(spec.data, "synthetic", None), "num_users"):
        return f" (data.synthetic.num_users={spec.cohort_size} or more)"
    if getattr(spec.data, "max_users", None) is not None:
        return " (data.max_users=null: all users)"
    return ""


def validate_against_data(spec: RunConfig, population: int, unit: str = "user") -> None:
    """Checks that need the population size (of users, or of examples for ``unit="example"``);
    warns when δ ≥ 1/N (a weak guarantee). With a public ``population`` (add/remove-one) the
    data's own count is private: N is the public one, the cohort is checked against it by the
    sampler, and no refusal or warning here depends on or prints the data's count."""
    if spec.population is not None:
        population = spec.population
    elif spec.cohort_size > population:
        raise ConfigError(f"cohort_size {spec.cohort_size} exceeds the population of {population} {unit}s: set "
                          f"cohort_size<={population} or use a larger dataset{_larger_data(spec)}")
    delta = spec.privacy.delta
    if delta >= 1.0 / population:
        log.warning("privacy.delta=%g >= 1/N=%g (N = %d %ss): the guarantee allows leaking a whole %s", delta,
                    1.0 / population, population, unit, unit)


def resolve_sampling(kind: str, mechanism: str) -> str:
    """``auto`` → the sampler the mechanism option declares (``default_sampling``: Poisson for
    independent noise, cyclic for the tree, cyclic-Poisson for BandMF); any other value is
    returned unchanged (and validated later)."""
    if kind != "auto":
        return kind
    option = option_preset("mechanism", mechanism)
    return getattr(option, "default_sampling", kind) if option is not None else kind
