"""Resolution and validation of a composed run config. Every check raises ``ConfigError`` (one
line, exit 2) before anything is written; the per-field checks live with the types in
:mod:`fedpriv.schema`."""

from __future__ import annotations

import dataclasses
import logging

from fedpriv.devices import resolve_device
from fedpriv.errors import ConfigError
from fedpriv.sampling import resolve_sampling
from fedpriv.schema import RunConfig, as_dict, parse, resolve_secure

log = logging.getLogger(__name__)


def resolve_config(cfg: dict) -> dict:
    """Resolve, in place, the values that mean "pick for me" — ``sampling=auto`` (the mechanism's
    sampler), ``privacy.secure_rng=null`` (secure for deployments) and, for ``model=hf`` with
    ``data.tokenizer=hf``, an unset ``data.tokenizer_path`` (``model.path``) — so that config.yaml names
    what the run does and server and clients derive the same research key. Idempotent."""
    cfg["sampling"] = resolve_sampling(cfg.get("sampling"), (cfg.get("mechanism") or {}).get("name"))
    privacy = cfg.setdefault("privacy", {})
    privacy["secure_rng"] = resolve_secure(cfg)
    data, model = cfg.get("data") or {}, cfg.get("model") or {}
    if data.get("tokenizer") == "hf" and not data.get("tokenizer_path") and model.get("name") == "hf":
        data["tokenizer_path"] = model.get("path")  # model=hf: its tokenizer lives beside it
    return cfg


def resolved(spec: RunConfig, cfg: dict) -> RunConfig:
    """``spec`` with the values :func:`resolve_config` resolved in ``cfg`` (no second parse)."""
    return dataclasses.replace(spec, sampling=cfg["sampling"],
                               privacy=dataclasses.replace(spec.privacy, secure_rng=cfg["privacy"]["secure_rng"]),
                               data=dataclasses.replace(spec.data, tokenizer_path=cfg["data"]["tokenizer_path"]))


def diagnostics_enabled(cfg: dict) -> bool:
    """Whether the run computes statistics of training users (``diagnostics.jsonl``): only in
    research mode, never in secure mode or a deployment, and only with ``diagnostics=true``."""
    backend = (cfg.get("backend") or {}).get("name")
    return bool(cfg.get("diagnostics", True)) and not resolve_secure(cfg) and backend != "deployment"


def client_diagnostics_enabled(cfg: dict) -> bool:
    """Whether clients report statistics of their data beside the delta (train loss, counts):
    with diagnostics, and never under example-level DP, whose replies carry the privatized delta
    and nothing else (the example-level guarantee is against the server too)."""
    return diagnostics_enabled(cfg) and ((cfg.get("client") or {}).get("dp") or "none") != "example"


def validate(cfg: dict) -> RunConfig:
    """Check the parts of ``cfg`` that do not need the dataset — the typed schema
    (:func:`fedpriv.schema.parse`: unknown keys, types, ranges, unsupported combinations) — and
    add, in place, the schema's default for every key ``cfg`` lacks (a composed config lacks none),
    so that code reads ``cfg[key]`` and no default is written twice."""
    parsed = parse(cfg)
    resolve_device(parsed.device)  # device=cuda without CUDA: refused here, before anything is written
    _fill(cfg, as_dict(parsed))
    return parsed


def _fill(cfg: dict, defaults: dict, root: dict | None = None) -> None:
    root = cfg if root is None else root
    for key, value in defaults.items():
        if key not in cfg:
            cfg[key] = _resolve(value, root)
        elif isinstance(value, dict) and isinstance(cfg[key], dict):
            _fill(cfg[key], value, root)


def _resolve(value, root: dict):
    """A default of the form ``${a.b}`` (Hydra interpolation) read from the config it fills."""
    if isinstance(value, str) and value.startswith("${") and value.endswith("}") and ":" not in value:
        node = root
        for part in value[2:-1].split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node
    return value


def _larger_data(cfg: dict) -> str:
    """The data key that sets the population, where the chosen dataset has one (the synthetic
    generator's user count; StackOverflow's cap on users), as a hint for a cohort that is too large."""
    data = cfg.get("data") or {}
    if isinstance(data.get("synthetic"), dict) and "num_users" in data["synthetic"]:
        return f" (data.synthetic.num_users={cfg['cohort_size']} or more)"
    if data.get("max_users") is not None:
        return " (data.max_users=null: all users)"
    return ""


def validate_against_data(cfg: dict, population: int, unit: str = "user") -> None:
    """Checks that need the population size (of users, or of examples for ``unit="example"``);
    warns when δ ≥ 1/N (a weak guarantee)."""
    if cfg["cohort_size"] > population:
        raise ConfigError(f"cohort_size {cfg['cohort_size']} exceeds the population of {population} {unit}s: set "
                          f"cohort_size<={population} or use a larger dataset{_larger_data(cfg)}")
    delta = cfg["privacy"]["delta"]
    if delta >= 1.0 / population:
        log.warning("privacy.delta=%g >= 1/N=%g (N = %d %ss): the guarantee allows leaking a whole %s", delta,
                    1.0 / population, population, unit, unit)
