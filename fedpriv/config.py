"""Validation of a resolved run config. Every check raises ``ConfigError`` (one line, exit 2)
before anything is written."""

from __future__ import annotations

import logging
import math
from typing import Any

from fedpriv.errors import ConfigError
from fedpriv.randomness import resolve_secure
from fedpriv.sampling import resolve_sampling

log = logging.getLogger(__name__)

MECHANISMS = ("gaussian", "tree", "bandmf")
SAMPLERS = ("poisson", "fixed", "cyclic", "cyclic_poisson")
ACCOUNTANTS = ("rdp", "pld")
BACKENDS = ("local", "flower", "deployment")
ALGORITHMS = ("dp_fedavg", "dp_fedsgd", "dpsgd")


def _positive(value: Any, name: str, integer: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok or (integer and int(value) != value):
        kind = "a positive integer" if integer else "a positive number"
        raise ConfigError(f"{name} must be {kind}, got {value!r}")


def _choice(value: Any, name: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"unknown {name} {value!r} (choose one of: {', '.join(choices)})")


def resolve_config(cfg: dict) -> dict:
    """Resolve, in place, the values that mean "pick for me" — ``sampling=auto`` (the mechanism's
    sampler) and ``privacy.secure_rng=null`` (secure for deployments) — so that config.yaml names
    what the run does and server and clients derive the same research key. Idempotent."""
    cfg["sampling"] = resolve_sampling(cfg.get("sampling"), (cfg.get("mechanism") or {}).get("name"))
    privacy = cfg.setdefault("privacy", {})
    privacy["secure_rng"] = resolve_secure(cfg)
    return cfg


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


def validate(cfg: dict) -> None:
    """Check the parts of ``cfg`` that do not need the dataset."""
    _positive(cfg.get("rounds"), "rounds", integer=True)
    _positive(cfg.get("cohort_size"), "cohort_size", integer=True)
    privacy = cfg.get("privacy") or {}
    sigma = privacy.get("noise_multiplier")
    if sigma is None:
        _positive(privacy.get("target_epsilon"), "privacy.target_epsilon")
    elif isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not math.isfinite(sigma) or sigma < 0:
        raise ConfigError(f"privacy.noise_multiplier must be >= 0 (0: non-private), got {sigma!r}")
    delta = privacy.get("delta")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise ConfigError(f"privacy.delta must be in (0, 1), got {delta!r}")
    _positive(privacy.get("clip_norm"), "privacy.clip_norm")
    _choice(privacy.get("accountant"), "privacy.accountant", ACCOUNTANTS)
    _choice(cfg.get("sampling"), "sampling", SAMPLERS)
    _choice((cfg.get("mechanism") or {}).get("name"), "mechanism", MECHANISMS)
    _choice((cfg.get("algorithm") or {}).get("name"), "algorithm", ALGORITHMS)
    _choice((cfg.get("backend") or {}).get("name"), "backend", BACKENDS)
    if cfg["algorithm"]["name"] == "dpsgd" and cfg["backend"]["name"] != "local":
        raise ConfigError("algorithm=dpsgd is central (pooled data, no clients): use backend=local")
    public = cfg.get("public") or {}
    steps = public.get("pretrain_steps") or 0
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ConfigError(f"public.pretrain_steps must be an integer >= 0, got {steps!r}")
    if steps:
        _positive(public.get("pretrain_batch_size"), "public.pretrain_batch_size", integer=True)
        _positive(public.get("pretrain_lr"), "public.pretrain_lr")
        fraction = public.get("pretrain_fraction", 1.0)
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ConfigError(f"public.pretrain_fraction must be in (0, 1], got {fraction!r}")
    client = cfg.get("client") or {}
    _positive(client.get("epochs"), "client.epochs", integer=True)
    _positive(client.get("batch_size"), "client.batch_size", integer=True)
    _positive(client.get("lr"), "client.lr")


def validate_against_data(cfg: dict, population: int, unit: str = "user") -> None:
    """Checks that need the population size (of users, or of examples for ``unit="example"``);
    warns when δ ≥ 1/N (a weak guarantee)."""
    if cfg["cohort_size"] > population:
        raise ConfigError(f"cohort_size {cfg['cohort_size']} exceeds the population of {population} {unit}s")
    delta = cfg["privacy"]["delta"]
    if delta >= 1.0 / population:
        log.warning("privacy.delta=%g >= 1/N=%g (N = %d %ss): the guarantee allows leaking a whole %s", delta,
                    1.0 / population, population, unit, unit)
