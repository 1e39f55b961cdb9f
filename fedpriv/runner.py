"""One training run: parse → plan (:mod:`fedpriv.plan`) → lock the run directory → build (→ restore)
→ rounds → outputs.

The transport of a round is injected (``round_fn``), so the same loop serves the in-process
backend, Flower's simulation engine and a real deployment; the DP math lives in
:mod:`fedpriv.round.dpfedavg`, :mod:`fedpriv.mechanisms` and :mod:`fedpriv.accounting`. The loop writes
no file: :mod:`fedpriv.release.run_outputs` does, and owns their order (a round's checkpoint is durable
before any output of that round is published, so a resumed run never redoes a published round
with the same noise, and republishes from the checkpoint whatever a crash kept from being written).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from fedpriv.accounting import PrivacyLedger
from fedpriv.accounting.ledger import json_epsilon
from fedpriv.round.adaptive_clipping import build_adaptive_clip
from fedpriv.audit.run import finish_audit
from fedpriv.config.resolve import diagnostics_enabled, run_config
from fedpriv.degradation import Degradation, degradation, run_facts
from fedpriv.round.dpfedavg import DPFedAvg
from fedpriv.errors import ConfigError, DamagedFileError
from fedpriv.mechanisms import Mechanism
from fedpriv.metrics import evaluate
from fedpriv.release.console import ADVICE_LOGGER
from fedpriv.models import set_flat_params
from fedpriv.plan import RunPlan, build_plan, executed_config
from fedpriv.plan.run_plan import KeyedParts
from fedpriv.plan.auto import overrides, plan_warning
from fedpriv.plan.noise_figure import A_WARN, PER_ROUND_WARNING, NoiseFigure
from fedpriv.precision import compute_precision
from fedpriv.public.stages import Stage, build_stages
from fedpriv.keys.randomness import RunRandomness, mode_label
from fedpriv.round.replies import RoundFn
from fedpriv.keys.research_key import canonical_config, research_key, run_randomness
from fedpriv.release.run_outputs import RunOutputs
from fedpriv.release.rundir import CHECKPOINT_FORMAT, SUMMARY_FILE, RunDirectory, short_reason
from fedpriv.schema import RunConfig, as_dict
from fedpriv.sums import withheld_rounds
from fedpriv.task import Task, load_task
from fedpriv.allocator import retain_freed_memory


log = logging.getLogger(__name__)

@dataclass
class RunSession:
    """Everything a run needs, built and validated before anything is written."""

    spec: RunConfig  # the run's validated, resolved config: everything reads its typed sections
    run: RunDirectory
    task: Task
    server: DPFedAvg
    ledger: PrivacyLedger
    stages: list[Stage]  # public-data hooks (fedpriv/public/stages.py): the loop names none
    randomness: RunRandomness
    plan: RunPlan  # what the config and the population decided before any key was drawn
    keyed: KeyedParts  # the parts that hold a key of the run's randomness (RunPlan.instantiate)
    start_round: int = 0
    wall_s: float = 0.0
    client_releases: int = 0  # rounds whose clients' example-level DP replies reached the server
    history: list[dict] = field(default_factory=list)  # metrics.jsonl rows (covered by the ledger)
    diagnostics: list[dict] = field(default_factory=list)  # diagnostics.jsonl rows (research only)

    @property
    def cfg(self) -> dict:
        """The plain form of ``spec`` (config.yaml, the research key, what clients receive): written
        and sent, never read for a field."""
        return as_dict(self.spec)

    @property
    def diagnostics_enabled(self) -> bool:
        return diagnostics_enabled(self.spec)


def prepare(cfg: dict, run: RunDirectory | None = None) -> RunSession:
    """Validate ``cfg`` (plain dict), lock its run directory, build the task and server, and
    restore the checkpoint when resuming.

    Raises ``ConfigError`` for bad input before writing any file: a fresh run's plan
    (:func:`fedpriv.plan.build_plan`, every refusal that needs the data) is built before its
    directory is locked; a directory locked by another run is refused (``RunDirectoryBusy``)
    without touching it. ``run``: a directory the caller has
    already locked (and cleans up on error); otherwise this call locks ``run_dir`` and, on
    error, removes it only if it created it and it is still empty. ``cfg`` is parsed once
    (:func:`fedpriv.config.resolve.run_config`: ``sampling=auto`` and ``privacy.secure_rng=null`` resolved,
    so config.yaml names what the run does); everything after reads the typed ``RunConfig``. The
    caller's ``cfg`` is then replaced by the run's resolved plain config (``session.cfg``, as in
    config.yaml, mechanism defaults fitted), so that a ClientApp made from it derives the run's key.
    """
    spec = run_config(cfg)
    retain_freed_memory()  # the run reallocates the same large tensors every step (fedpriv.allocator)
    task = load_task(spec)
    # a fresh run: every refusal that needs the data before the directory is locked; a resumed one
    # plans on its checkpoint's strategy (σ as calibrated for the rounds it already ran)
    plan = None if spec.resume else build_plan(spec, task)
    own = run is None
    run = run if run is not None else RunDirectory(spec.run_dir).lock()
    try:
        session = _build(spec, task, run, plan)
    except BaseException:
        if own:
            run.abandon()
        raise
    cfg.clear()
    cfg.update(session.cfg)
    return session


def _build(spec: RunConfig, task: Task, run: RunDirectory, plan: RunPlan | None) -> RunSession:
    """The session of ``spec`` in the locked ``run``: the checkpoint read (``plan`` None: planned
    here, on the checkpoint's strategy when there is one), the run's randomness drawn, and the
    keyed sampler and mechanism, the optimizer, the clip rule and the ledger built as planned."""
    fitted = plan.spec if plan is not None else executed_config(spec, task)
    checkpoint = _resumable_checkpoint(run, fitted)
    if plan is None:
        adopt = None if checkpoint is None else (lambda mechanism: _adopt_strategy(mechanism, checkpoint, run))
        plan = build_plan(fitted, task, adopt=adopt)
    spec, privacy, task = plan.spec, plan.spec.privacy, plan.task
    if plan.choice is not None:  # what the planner replaced, once, on stderr (advice)
        logging.getLogger(ADVICE_LOGGER).info("plan=auto sets %s (docs/PLANNER.md)", " ".join(overrides(plan.choice)))
        if warning := plan_warning(plan.choice, privacy.target_epsilon):
            logging.getLogger(ADVICE_LOGGER).warning("%s", warning)
    randomness = _randomness(spec, checkpoint, run)
    keyed = plan.instantiate(randomness)  # the one construction site of the parts that hold a key
    sampler, mechanism = keyed.sampler, keyed.mechanism
    _adopt_strategy(mechanism, checkpoint, run)
    ledger = plan.ledger.bind(mechanism, sampler, randomness.describe())
    optimizer = spec.optimizer.build(spec.rounds)
    clip = build_adaptive_clip(privacy, plan.noise_multiplier, sampler.expected_cohort,
                               squares=optimizer.query_plan.squares, optimizer=spec.optimizer.name)
    if ledger.non_private_reason:
        log.warning("NOT PRIVATE: %s; the run reports epsilon = inf", ledger.non_private_reason)
    if privacy.noise_multiplier is not None and privacy.target_epsilon is not None:
        log.warning("privacy.noise_multiplier=%g is used as given: the target epsilon %g (from the experiment or "
                    "the defaults) is not, and epsilon follows from sigma", privacy.noise_multiplier,
                    privacy.target_epsilon)
    stages = build_stages(spec.public, task, spec.seed, spec.rounds)
    initial = task.initial_params
    for stage in stages:
        initial = stage.initial_params(initial)
    if initial.numel() != plan.ledger.dimension:  # the canaries and the noise are sized by the plan
        raise RuntimeError(f"the public stages changed the model's size ({plan.ledger.dimension} -> {initial.numel()})")
    server = DPFedAvg(initial, sampler, mechanism, privacy.clip_norm, optimizer, ema_decay=spec.ema_decay,
                      canaries=keyed.canaries, clip=clip)
    session = RunSession(spec=spec, run=run, task=task, server=server, ledger=ledger, stages=stages,
                         randomness=randomness, plan=plan, keyed=keyed)
    if checkpoint is not None:
        _restore(session, checkpoint)
    _count_client_releases(session, checkpoint)
    _say_noise_scale(ledger, plan.noise)  # last: on stderr, so no bad-input error of prepare can follow it
    return session


def _say_noise_scale(ledger: PrivacyLedger, noise: NoiseFigure) -> None:
    """One line before training: σ/m̄, the noise on each coordinate of the averaged update in units
    of the clip bound, σ·√d/m̄, its norm over the d trained parameters in the same units
    (privacy.json ``averaged_noise_to_clip``, ``averaged_noise_norm_to_clip``), and the noise the
    server step accumulates in the model over the run (a, :mod:`fedpriv.plan.noise_figure`), on
    stderr (advice, not a result); a ``warning:`` where a is above ``A_WARN``, where measured runs
    degrade (or, for an optimizer a does not describe, where σ·√d/m̄ is above
    ``PER_ROUND_WARNING``)."""
    ratio, norm = ledger.averaged_noise_to_clip, ledger.averaged_noise_norm_to_clip
    text = (f"noise multiplier {ledger.noise_multiplier:.4g} over an expected cohort of "
            f"{ledger.sampler.expected_cohort:.4g}: the averaged update gets noise of std {ratio:.3g} x the clip "
            f"bound per coordinate, of norm {norm:.3g} x the clip bound over its {ledger.dimension} coordinates")
    if noise.accumulated is not None:
        text += (f"; the server step accumulates noise of std {noise.accumulated:.3g} per coordinate over the run "
                 f"(a, with sigma_eff {noise.sigma_eff:.3g})")
    advice = logging.getLogger(ADVICE_LOGGER)  # on stderr either way (fedpriv/release/console.py)
    if noise.too_noisy and noise.accumulated is not None:
        advice.warning("%s (a above %g: measured runs degrade there; plan=auto, a larger cohort, a smaller "
                       "optimizer.lr or correlated noise lower it)", text, A_WARN)
    elif noise.too_noisy:
        advice.warning("%s (above %g: likely too noisy to learn; more users per round, more users in all, a larger "
                       "epsilon or a smaller model lower it)", text, PER_ROUND_WARNING)
    else:
        advice.info("%s", text)


def _count_client_releases(session: RunSession, checkpoint: dict | None) -> None:
    """Client example-level DP: the rounds whose replies reached the server, from the checkpoint
    and the record written before each round's clients were asked. A round asked before a crash
    and asked again on resume released twice (in secure mode its clients draw fresh noise), so it
    is charged twice (docs/PRIVACY.md)."""
    if session.task.local.dp is None:
        return
    saved = int((checkpoint or {}).get("client_releases", session.start_round))
    session.client_releases = max(saved, session.run.read_client_releases())
    if session.client_releases > session.start_round:
        log.warning("the clients of %d round(s) replied before an interruption and are asked again: the example-level "
                    "epsilon charges both releases", session.client_releases - session.start_round)


def _adopt_strategy(mechanism: Mechanism, checkpoint: dict | None, run: RunDirectory | None) -> None:
    """A resumed run's mechanism takes its strategy (BLT's parameters, BandMF's bands) from the
    checkpoint, never from the cache or a new optimisation: the earlier rounds used exactly it."""
    if checkpoint is None:
        return
    try:
        mechanism.adopt_strategy(checkpoint["server"]["mechanism"])
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise _does_not_fit(run, err) from None


def _does_not_fit(run: RunDirectory, err: Exception) -> DamagedFileError:
    """The one-line error for a checkpoint whose state this run cannot take (``err`` on one line,
    shortened at a word boundary, then the advice)."""
    return DamagedFileError(f"checkpoint {run.checkpoint_path} does not fit this run ({short_reason(err)}); this run "
                            "cannot resume from it: use another run_dir")


def _resumable_checkpoint(run: RunDirectory, spec: RunConfig) -> dict | None:
    """The checkpoint to resume from (None: a fresh run); refuses a directory that holds another run."""
    saved_cfg = run.read_config()
    checkpoint = run.load_checkpoint()
    if checkpoint is None:
        if saved_cfg is None:
            if spec.resume:
                raise ConfigError(f"resume=true, but run directory {run.path} holds no run to resume "
                                  "(check run_dir)")
            return None
        if run.read_metrics() or (run.path / SUMMARY_FILE).exists():
            raise ConfigError(f"run directory {run.path} holds the outputs of a run but no checkpoint, so it cannot "
                              "be resumed (and is not overwritten): use another run_dir")
        if not spec.resume:
            raise ConfigError(f"run directory {run.path} already holds a run: pass resume=true or another run_dir")
        if diff := _config_diff(saved_cfg, spec):
            raise ConfigError(_differs_message(run, diff, saved_cfg, spec))
        return None  # it stopped before its first checkpoint: start it again
    if not spec.resume:
        raise ConfigError(f"run directory {run.path} already holds a checkpoint: pass resume=true or another run_dir")
    saved = checkpoint["config"]
    if not isinstance(saved, dict):
        raise DamagedFileError(f"checkpoint {run.checkpoint_path} is damaged (its config is not a mapping)")
    if diff := _config_diff(saved, spec):
        raise ConfigError(_differs_message(run, diff, saved, spec))
    return checkpoint


def _differs_message(run: RunDirectory, diff: list[str], saved: dict, spec: RunConfig) -> str:
    """Why a resume with another config is refused, and what to do: the rounds of a run are fixed
    when it starts (σ is calibrated and ε accounted for them), so a finished run cannot be extended."""
    text = f"cannot resume {run.path}: config differs in {', '.join(diff)}"
    if "rounds" not in diff:
        return f"{text}: resume with the config it was started with, or use another run_dir"
    was, now = saved.get("rounds"), spec.rounds  # saved: the config the checkpoint holds
    if (run.path / SUMMARY_FILE).exists():
        return (f"{text} ({was} -> {now}): a finished run cannot be extended (its noise was calibrated and its "
                f"epsilon accounted for {was} rounds); start a new run with rounds={now} and another run_dir")
    return (f"{text} ({was} -> {now}): the rounds are fixed when a run starts (noise calibrated for {was}); resume "
            f"with rounds={was}, or start a new run with rounds={now} and another run_dir")


def _config_diff(saved: dict, spec: RunConfig) -> list[str]:
    """Top-level keys whose computing values differ (presentation keys may change on resume)."""
    mine, theirs = canonical_config(as_dict(spec)), canonical_config(saved)
    return sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))


def _randomness(spec: RunConfig, checkpoint: dict | None, run: RunDirectory) -> RunRandomness:
    """A fresh run's randomness (research: from the config; secure: a new OS-CSPRNG key), or the
    checkpoint's when resuming, so the noise stream and the cohorts continue where they stopped."""
    if checkpoint is None:
        return run_randomness(spec)
    try:
        randomness = RunRandomness.from_state(checkpoint["randomness"])
    except (KeyError, TypeError, ValueError, AttributeError):
        raise DamagedFileError(f"checkpoint {run.checkpoint_path} is damaged (its randomness state)") from None
    if not randomness.secure and randomness.key != research_key(spec):
        raise DamagedFileError(f"checkpoint {run.checkpoint_path} holds a research key that this config does "
                               "not derive: it was not written by this run")
    return randomness


def _restore(session: RunSession, checkpoint: dict) -> None:
    try:
        session.server.load_state_dict(checkpoint["server"])
        session.ledger.load_state_dict(checkpoint["ledger"])
        session.start_round = int(checkpoint["round"])
        session.wall_s = float(checkpoint["wall_s"])
        session.history = [dict(r) for r in checkpoint["history"]]
        session.diagnostics = [dict(r) for r in checkpoint["diagnostics"]]
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as err:
        raise _does_not_fit(session.run, err) from None
    if session.start_round != session.ledger.rounds_done or len(session.history) != session.start_round:
        raise DamagedFileError(f"checkpoint {session.run.checkpoint_path} is inconsistent "
                               f"(round {session.start_round}, ledger {session.ledger.rounds_done} rounds)")


def evaluate_params(task: Task, params: torch.Tensor) -> dict[str, float]:
    """The test metrics of ``params``, computed in IEEE float32 whatever ``client.precision`` (so
    metrics compare across modes; torch's own default would run cuDNN's LSTM in TF32)."""
    set_flat_params(task.eval_model, params)
    with compute_precision("fp32", task.device):
        return evaluate(task.eval_model, task.data.test, task.data.vocab, word_of=task.data.test_word_of)


def train(session: RunSession, round_fn: RoundFn) -> dict:
    """Run the remaining rounds; their files are written by the run's output sink
    (:class:`fedpriv.release.run_outputs.RunOutputs`, which owns the order of writes). Releases the run
    directory's lock on return."""
    outputs = RunOutputs(session.run, session.spec, session.randomness.secure, _tensorboard_texts(session))
    try:
        return _train(session, round_fn, outputs)
    finally:
        outputs.settle()
        session.run.unlock()


def _train(session: RunSession, round_fn: RoundFn, outputs: RunOutputs) -> dict:
    spec, server, ledger = session.spec, session.server, session.ledger
    rounds = spec.rounds
    diagnostics = session.diagnostics_enabled
    outputs.start(session.cfg, session.history, session.diagnostics, ledger)
    started = time.perf_counter() - session.wall_s
    last_eval: dict[str, float] = {}
    bar = tqdm(range(session.start_round, rounds), total=rounds, initial=session.start_round,
               desc=f"rounds ({session.randomness.label} mode)", disable=None if spec.progress else True,
               dynamic_ncols=True,
               bar_format=None if diagnostics else "{desc}: {n_fmt}/{total_fmt} |{bar}|{postfix}")
    for r in bar:
        row, evaluation = run_round(session, round_fn, outputs, r, started)
        last_eval = evaluation or last_eval
        if "test_accuracy" in row:
            bar.set_postfix(acc=f"{row['test_accuracy']:.3f}", eps=f"{ledger.reported_epsilon():.3g}")
    bar.close()
    outputs.close_rounds()
    if not last_eval:  # resumed after the last round: evaluate the restored model
        last_eval = evaluate_params(session.task, server.model_params)
    data = session.task.data  # the verdict reads the test split and public quantities only
    verdict = degradation(session.history, data.unigram_accuracy, data.vocab.size,
                          run_facts(spec, session.plan, data.test_unknown_share))
    summary = _summary(session, last_eval, time.perf_counter() - started, verdict)
    audit = None
    if server.canaries is not None:  # post-processing of the releases and the canaries (docs/PRIVACY.md)
        def audit():
            return finish_audit(server.canaries, server.model_params, spec.audit, spec.privacy.delta,
                                ledger.reported_epsilon(), session.randomness.label)
    # post-processing of the released model (the ledger covers it), labelled with the run's claim and mode
    written = outputs.finish(summary, audit, session.task.eval_model, server.model_params, session.task.data)
    if verdict is not None:  # test-set metrics and public quantities only (fedpriv/degradation.py)
        logging.getLogger(ADVICE_LOGGER).warning("%s", verdict.message())
    return written


def run_round(session: RunSession, round_fn: RoundFn, outputs: RunOutputs, r: int,
              started: float) -> tuple[dict, dict[str, float]]:
    """Round ``r`` (0-based) of the loop: the budget gate, the cohort, the clients (``round_fn``),
    the privatized step, the ledger's record, the public stages, the evaluation when due, and the
    round's checkpoint and outputs in :class:`RunOutputs`' order. Returns the round's metrics row
    and its evaluation ({} when none was due); ``started`` is the run's clock origin."""
    spec, server, ledger = session.spec, session.server, session.ledger
    eval_every = spec.eval_every or spec.rounds
    ledger.check_can_run(ledger.rounds_done + 1)
    cohort = server.cohort(r)
    if session.task.local.dp is not None:  # charged before the clients are asked: a crash cannot hide it
        session.client_releases += 1
        outputs.clients_asked(session.client_releases)
    replies = round_fn(server.round_inputs(r, cohort))
    released, diag = server.apply_round(r, cohort, replies, diagnostics=session.diagnostics_enabled)
    ledger.record_round(r)
    audited = {"audit_canaries": ledger.audit["canaries"]} if ledger.audit else {}  # labelled from round 1
    row = {"round": r + 1, **_epsilon_fields(ledger.reported_epsilon()), "mode": session.randomness.label, **audited,
           **released}
    for stage in session.stages:  # public data and the release only: post-processing, no ledger entry
        params, fields = stage.after_round(r + 1, server.model_params)
        if params is not None:
            server.reset(params)
        row.update(fields)
    evaluation: dict[str, float] = {}
    if (r + 1) % eval_every == 0 or r + 1 == spec.rounds:
        evaluation = evaluate_params(session.task, server.model_params)
        row.update({f"test_{k}": v for k, v in evaluation.items()})
    wall_s = time.perf_counter() - started
    session.history.append(row)
    if session.diagnostics_enabled:
        session.diagnostics.append({"round": r + 1, **diag, "wall_s": wall_s})
    outputs.round_done(_checkpoint(session, r + 1, wall_s), session.history, session.diagnostics, ledger)
    return row, evaluation


def _tensorboard_texts(session: RunSession) -> dict[str, str]:
    """TensorBoard's text entries: the randomness mode, and an audited run's label."""
    randomness = session.randomness.describe()
    texts = {"privacy/randomness": f"{mode_label(randomness)} mode: {randomness['note']}"}
    if session.ledger.audit:
        texts["privacy/audit"] = session.ledger.audit["note"]
    return texts


def _epsilon_fields(epsilon: float) -> dict:
    """ε for a metrics row: a number, or null with ``non_private: true`` (the privacy.json convention)."""
    value = json_epsilon(epsilon)
    return {"epsilon": None, "non_private": True} if value is None else {"epsilon": value}


def _checkpoint(session: RunSession, round_done: int, wall_s: float) -> dict:
    return {"format": CHECKPOINT_FORMAT, "round": round_done, "server": session.server.state_dict(),
            "ledger": session.ledger.state_dict(), "randomness": session.randomness.state_dict(),
            "history": session.history, "diagnostics": session.diagnostics, "wall_s": wall_s,
            "client_releases": session.client_releases, "config": session.cfg}


def _summary(session: RunSession, final: dict[str, float], wall_s: float, verdict: Degradation | None) -> dict:
    spec, data = session.spec, session.task.data
    return {
        "final": final,
        "degraded": verdict is not None,
        **({"degradation": verdict.to_dict()} if verdict is not None else {}),
        "privacy": _privacy_summary(session),
        "rounds": session.ledger.rounds_done,
        **_withheld_rounds(session),
        **({"wall_s": wall_s} if session.diagnostics_enabled else {}),  # timing depends on the cohorts
        "ceiling_accuracy": data.ceiling_accuracy,
        "unigram_accuracy": data.unigram_accuracy,
        **({"reference_source": data.reference_source} if data.reference_source else {}),
        **({"test_unknown_share": data.test_unknown_share} if data.test_unknown_share is not None else {}),
        "dataset": data.name, **({"num_users": data.num_users} if session.ledger.releases_data_count else {}),
        "privacy_unit": session.task.algorithm.privacy_unit,
        "noise": session.plan.noise.describe(),  # public quantities: σ, m̄, d, T and the server step
        **({"plan": session.plan.choice} if session.plan.choice is not None else {}),
        "model": spec.model.name, "algorithm": spec.algorithm.name,
        "optimizer": spec.optimizer.name, "backend": spec.backend.name,
        "clip_norm": spec.privacy.clip_norm, "cohort_size": spec.cohort_size,
        **({"clipping": "adaptive", "final_clip_norm": session.server.clip_norm} if session.server.clip else {}),
        **_example_privacy(session),
        **{k: v for stage in session.stages for k, v in stage.summary(session.history).items()},
    }


def _withheld_rounds(session: RunSession) -> dict:
    """The rounds withheld for too few noise shares, where the parties add the noise
    (:func:`fedpriv.sums.withheld_rounds`)."""
    return withheld_rounds(session.plan.sums, session.history)


def _privacy_summary(session: RunSession) -> dict:
    """The ledger's guarantee as privacy.json states it (ε = ∞ for any non-private run)."""
    ledger = session.ledger.to_dict()
    keys = ("epsilon", "non_private", "delta", "accountant", "neighboring_relation", "noise_multiplier",
            "target_epsilon", "mechanism", "sampling", "randomness", "non_private_reason",
            "accounted_epsilon_of_the_noised_update_only", "monte_carlo_claim")
    return {k: ledger[k] for k in keys if k in ledger}


def _example_privacy(session: RunSession) -> dict:
    """Clients' example-level guarantee (client.dp=example), on top of the user-level one."""
    dp = session.task.local.dp
    if dp is None:
        return {}
    releases = max(session.client_releases, session.ledger.rounds_done)
    eps = dp.epsilon(releases, session.spec.privacy.accountant)
    again = releases - session.ledger.rounds_done
    return {"example_privacy": {
        "epsilon": json_epsilon(eps), "delta": dp.delta, "noise_multiplier": dp.noise_multiplier,
        "accountant": session.spec.privacy.accountant, "neighboring_relation": "add_or_remove_one",
        "sampling_rate": dp.sampling_rate, "steps_per_round": dp.steps, "clip_norm": dp.clip_norm,
        "denominator": dp.denominator, "rounds_charged": releases,
        **({"rounds_asked_again_after_an_interruption": again} if again else {}),
        "assumes": "every client takes part in every round (no amplification by user sampling)"}}
