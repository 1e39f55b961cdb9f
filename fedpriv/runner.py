"""One training run: validate → build → (resume) → rounds → outputs.

The transport of a round is injected (``round_fn``), so the same loop serves the in-process
backend, Flower's simulation engine and a real deployment; the DP math lives in
:mod:`fedpriv.dpfedavg`, :mod:`fedpriv.mechanisms` and :mod:`fedpriv.accounting`.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from fedpriv.accounting import PrivacyLedger, calibrate_noise_multiplier
from fedpriv.cohort import CohortClipper, CohortSum
from fedpriv.config import validate, validate_against_data
from fedpriv.dpfedavg import ClientUpdate, DPFedAvg
from fedpriv.errors import ConfigError
from fedpriv.mechanisms import Mechanism, build_mechanism
from fedpriv.metrics import evaluate
from fedpriv.models import set_flat_params
from fedpriv.optim import build_server_optimizer
from fedpriv.optim.adaptive import check_adaptive
from fedpriv.observe import RoundObserver, check_observability
from fedpriv.public.midtrain import check_mid_training, mid_train
from fedpriv.public.setup import PublicArtifacts, prepare_public
from fedpriv.rundir import RunDirectory
from fedpriv.sampling import make_sampler, resolve_sampling
from fedpriv.task import EXAMPLE_LEVEL_ALGORITHMS, Task, load_task
from fedpriv.training import client_generator, local_update


log = logging.getLogger(__name__)

# Keys that may differ between the original run and its resumption.
RESUME_FREE_KEYS = ("resume", "backend", "progress", "run_dir", "verbose", "tensorboard")

RoundFn = Callable[[int, np.ndarray], "list[ClientUpdate] | CohortSum"]


def _noise_multiplier(cfg: dict, mechanism: Mechanism, sampler) -> float:
    privacy = cfg["privacy"]
    if privacy.get("noise_multiplier") is not None:
        return float(privacy["noise_multiplier"])
    return calibrate_noise_multiplier(
        lambda s: mechanism.dp_event(sampler, cfg["rounds"], noise_multiplier=s),
        privacy["target_epsilon"], privacy["delta"], privacy["accountant"],
        mechanism.neighboring_relation(sampler))


@dataclass
class RunSession:
    """Everything a run needs, built and validated before anything is written."""

    cfg: dict
    run: RunDirectory
    task: Task
    server: DPFedAvg
    ledger: PrivacyLedger
    public: PublicArtifacts
    start_round: int = 0
    wall_s: float = 0.0
    history: list[dict] = field(default_factory=list)


def prepare(cfg: dict) -> RunSession:
    """Validate ``cfg`` (plain dict), build the task and server, and restore a checkpoint when resuming.

    Raises ``ConfigError`` for bad input before creating or writing any file. ``sampling=auto`` is
    resolved here, so the run's config.yaml names the sampler actually used.
    """
    cfg["sampling"] = resolve_sampling(cfg.get("sampling"), (cfg.get("mechanism") or {}).get("name"))
    validate(cfg)
    task = load_task(cfg)
    validate_against_data(cfg, len(task.units), privacy_unit(cfg))
    privacy = cfg["privacy"]
    sampler = make_sampler(cfg["sampling"], len(task.units), int(cfg["cohort_size"]), int(cfg["seed"]),
                           groups=(cfg.get("mechanism") or {}).get("bands"))
    mechanism = build_mechanism(cfg["mechanism"], 0.0, privacy["clip_norm"], seed=cfg["seed"],
                                secure=bool(privacy.get("secure_rng")), rounds=int(cfg["rounds"]))
    mechanism.noise_multiplier = _noise_multiplier(cfg, mechanism, sampler)
    target = privacy["target_epsilon"] if privacy.get("noise_multiplier") is None else None
    ledger = PrivacyLedger(mechanism, sampler, privacy["delta"], privacy["accountant"], target_epsilon=target,
                           planned_rounds=int(cfg["rounds"]))
    ledger.check_can_run(int(cfg["rounds"]))
    check_mid_training(cfg.get("public") or {}, int(cfg["rounds"]))
    check_observability(cfg)
    opt_cfg = dict(cfg["optimizer"])
    optimizer = build_server_optimizer(opt_cfg.pop("name"), rounds=int(cfg["rounds"]), **opt_cfg)
    check_adaptive(optimizer, cfg["mechanism"]["name"], uses_one_pass(cfg))
    if getattr(optimizer, "non_private_reason", None):
        log.warning("NOT PRIVATE: %s; the run reports epsilon = inf", optimizer.non_private_reason)
    public = prepare_public(cfg.get("public") or {}, task, int(cfg["seed"]))
    server = DPFedAvg(public.initial_params, sampler, mechanism, privacy["clip_norm"], optimizer,
                      ema_decay=float(cfg.get("ema_decay") or 0.0))
    session = RunSession(cfg=cfg, run=RunDirectory(cfg["run_dir"]), task=task, server=server, ledger=ledger,
                         public=public)
    _restore(session)
    return session


def _restore(session: RunSession) -> None:
    run, cfg = session.run, session.cfg
    checkpoint = run.load_checkpoint()
    if checkpoint is None:
        if run.read_config() is not None and not cfg.get("resume"):
            raise ConfigError(f"run directory {run.path} already holds a run: pass resume=true or another run_dir")
        return
    if not cfg.get("resume"):
        raise ConfigError(f"run directory {run.path} already holds a checkpoint: pass resume=true or another run_dir")
    saved = checkpoint["config"]
    diff = sorted(k for k in set(saved) | set(cfg) if k not in RESUME_FREE_KEYS and saved.get(k) != cfg.get(k))
    if diff:
        raise ConfigError(f"cannot resume {run.path}: config differs in {', '.join(diff)}")
    session.server.load_state_dict(checkpoint["server"])
    session.ledger.load_state_dict(checkpoint["ledger"])
    session.start_round = int(checkpoint["round"])
    session.wall_s = float(checkpoint["wall_s"])
    session.history = [r for r in run.read_metrics() if r["round"] <= session.start_round]


def client_update(task: Task, params: torch.Tensor, user: int, round_idx: int) -> ClientUpdate:
    """What client ``user`` computes in round ``round_idx`` from the global ``params``."""
    delta, metrics = local_update(task.client_model, params, task.units[user], task.local,
                                  client_generator(task.seed, round_idx, user), task.data.vocab.pad_id,
                                  bk=task.bk)
    return ClientUpdate(user=user, delta=delta, metrics=metrics)


def privacy_unit(cfg: dict) -> str:
    """What one sampled, clipped contribution is: a ``user`` (federated) or an ``example`` (dpsgd)."""
    return "example" if cfg["algorithm"]["name"] in EXAMPLE_LEVEL_ALGORITHMS else "user"


def uses_one_pass(cfg: dict) -> bool:
    """Whether the in-process backend computes a round's clipped sum in one batched BK pass."""
    algorithm = cfg["algorithm"]
    return algorithm["name"] == "dpsgd" or (algorithm["name"] == "dp_fedsgd" and bool(algorithm.get("one_pass", True)))


def one_pass_round_fn(session: RunSession) -> RoundFn:
    """A round whose units each take one gradient step, clipped together by one BK pass per chunk
    (DP-FedSGD's cohort, or DP-SGD's Poisson batch); equal to the per-client loop's clipped sum."""
    task, algorithm = session.task, session.cfg["algorithm"]
    clipper = CohortClipper(copy.deepcopy(task.client_model), session.server.clip_norm, task.local.lr,
                            task.data.vocab.pad_id, mode=algorithm.get("clipping_mode", "mixopt"),
                            max_rows=int(algorithm.get("max_rows", 512)))

    def round_fn(round_idx: int, cohort: np.ndarray) -> CohortSum:
        del round_idx  # one full-batch step: no data order to seed
        return clipper.clipped_sum(session.server.params, cohort, lambda u: task.units[u])

    return round_fn


def evaluate_params(task: Task, params: torch.Tensor) -> dict[str, float]:
    set_flat_params(task.eval_model, params)
    return evaluate(task.eval_model, task.data.test, task.data.vocab, word_of=task.data.test_word_of)


def train(session: RunSession, round_fn: RoundFn) -> dict:
    """Run the remaining rounds, writing metrics, privacy ledger and checkpoint after each one."""
    cfg, run, server, ledger = session.cfg, session.run, session.server, session.ledger
    rounds = int(cfg["rounds"])
    eval_every = int(cfg.get("eval_every") or rounds)
    mid_round = check_mid_training(cfg.get("public") or {}, rounds)
    run.create()
    run.write_config(cfg)
    run.write_metrics(session.history)
    ledger.save(run.path)
    observe = RoundObserver(cfg, run.path)
    started = time.perf_counter() - session.wall_s
    last_eval: dict[str, float] = {}
    bar = tqdm(range(session.start_round, rounds), total=rounds, initial=session.start_round,
               desc="rounds", disable=not cfg.get("progress", True), dynamic_ncols=True)
    for r in bar:
        ledger.check_can_run(ledger.rounds_done + 1)
        cohort = server.cohort(r)
        stats = server.apply_round(r, cohort, round_fn(r, cohort))
        epsilon = ledger.record_round(r)
        row = {"round": r + 1, "epsilon": epsilon, **stats}
        if mid_round == r + 1:  # post-processing of the DP model with public data: no ledger entry
            server.params, row["distribution_matching"] = mid_train(session.task, session.public,
                                                                    server.model_params, cfg["public"],
                                                                    int(cfg["seed"]))
            server.ema = server.params.clone()
        if (r + 1) % eval_every == 0 or r + 1 == rounds:
            last_eval = evaluate_params(session.task, server.model_params)
            row.update({f"test_{k}": v for k, v in last_eval.items()})
            bar.set_postfix(acc=f"{last_eval['accuracy']:.3f}", eps=f"{epsilon:.3g}")
        row["wall_s"] = time.perf_counter() - started
        run.append_metrics(row)
        ledger.save(run.path)
        run.save_checkpoint({"round": r + 1, "server": server.state_dict(), "ledger": ledger.state_dict(),
                             "wall_s": row["wall_s"], "config": cfg})
        session.history.append(row)
        observe(row)
    bar.close()
    observe.close()
    if not last_eval:  # resumed after the last round: evaluate the restored model
        last_eval = evaluate_params(session.task, server.model_params)
    summary = _summary(session, last_eval, time.perf_counter() - started)
    run.write_json("summary.json", summary)
    return summary


def _privacy_summary(session: RunSession) -> dict:
    """The ledger's guarantee — or none, when the optimizer read noiseless statistics."""
    ledger = session.ledger.to_dict()
    out = {k: ledger[k] for k in ("epsilon", "non_private", "delta", "accountant", "neighboring_relation",
                                  "noise_multiplier", "target_epsilon", "mechanism", "sampling")}
    reason = getattr(session.server.optimizer, "non_private_reason", None)
    if reason:
        out.update({"epsilon": math.inf, "non_private": True, "non_private_reason": reason,
                    "ledger_epsilon_of_the_noised_update": ledger["epsilon"]})
    return out


def _summary(session: RunSession, final: dict[str, float], wall_s: float) -> dict:
    cfg, data = session.cfg, session.task.data
    return {
        "final": final,
        "privacy": _privacy_summary(session),
        "rounds": session.ledger.rounds_done,
        "wall_s": wall_s,
        "ceiling_accuracy": data.ceiling_accuracy,
        "unigram_accuracy": data.unigram_accuracy,
        "dataset": data.name, "num_users": data.num_users, "privacy_unit": privacy_unit(cfg),
        "model": cfg["model"]["name"], "algorithm": cfg["algorithm"]["name"],
        "optimizer": cfg["optimizer"]["name"], "backend": cfg["backend"]["name"],
        "clip_norm": cfg["privacy"]["clip_norm"], "cohort_size": cfg["cohort_size"],
        **_example_privacy(session),
        **({"public": session.public.stats} if session.public.stats else {}),
        **{k: v for row in session.history for k, v in row.items() if k == "distribution_matching"},
    }


def _example_privacy(session: RunSession) -> dict:
    """Clients' example-level guarantee (client.dp=example), on top of the user-level one."""
    dp = session.task.local.dp
    if dp is None:
        return {}
    eps = dp.epsilon(session.ledger.rounds_done, session.cfg["privacy"]["accountant"])
    return {"example_privacy": {
        "epsilon": None if math.isinf(eps) else eps, "delta": dp.delta, "noise_multiplier": dp.noise_multiplier,
        "accountant": session.cfg["privacy"]["accountant"], "neighboring_relation": "add_or_remove_one",
        "sampling_rate": dp.sampling_rate, "steps_per_round": dp.steps, "clip_norm": dp.clip_norm,
        "assumes": "every client takes part in every round (no amplification by user sampling)"}}


def format_result(summary: dict) -> str:
    """The two lines the CLI prints at the end of a run."""
    eps = summary["privacy"]["epsilon"]
    eps_text = "inf (non-private)" if eps is None or (isinstance(eps, float) and math.isinf(eps)) else f"{eps:.4g}"
    ceiling = summary.get("ceiling_accuracy")
    ceiling_text = f" (Bayes ceiling {ceiling:.4f})" if ceiling else ""
    final = summary["final"]
    accuracy = (f"final next-word accuracy {final['word_accuracy']:.4f}{ceiling_text}, "
                f"next-token accuracy {final['accuracy']:.4f}" if "word_accuracy" in final
                else f"final accuracy {final['accuracy']:.4f}{ceiling_text}")
    return (f"{accuracy}, loss {final['loss']:.4f}\n"
            f"{summary.get('privacy_unit', 'user')}-level epsilon {eps_text} at delta {summary['privacy']['delta']:g} "
            f"({summary['privacy']['accountant']}, {summary['privacy']['neighboring_relation']}), "
            f"noise multiplier {summary['privacy']['noise_multiplier']:.4g}, {summary['rounds']} rounds"
            f"{_example_line(summary)}")


def _example_line(summary: dict) -> str:
    ex = summary.get("example_privacy")
    if not ex:
        return ""
    eps = "inf" if ex["epsilon"] is None else f"{ex['epsilon']:.4g}"
    return (f"\nexample-level epsilon on clients {eps} at delta {ex['delta']:g} "
            f"({ex['accountant']}, add_or_remove_one example), noise multiplier {ex['noise_multiplier']:.4g}, "
            "every client assumed in every round")
