"""``plan=auto``: the cohort, rounds, mechanism, sampler, accountant, clip bound and server step of
a run, chosen from public quantities only (docs/PLANNER.md).

Inputs: the public number of users N (``population``, or a generator's configured count), the
trained parameter count d, ε and δ, the compute budget U = ``plan.client_updates`` (expected cohort
× rounds ≤ U; default: the configured ``cohort_size`` × ``rounds``) and the clients' local work as
configured (unchanged). No example is read: a plan is the same for any data of the same public size.

The rule. For each cohort m on a geometric grid (× :data:`GRID_RATIO`) with T = ⌊U/m⌋ rounds
(:data:`MIN_ROUNDS` ≤ T ≤ :data:`MAX_ROUNDS`) and each candidate mechanism/sampler/accountant
(:data:`CANDIDATES`), σ is calibrated to (ε, δ) with the repository's accountant, σ_eff = σ·g from
the mechanism's noise matrix (:func:`fedpriv.plan.noise_figure.iterate_noise_factor`), and the
server step η·C is the largest up to :data:`MAX_STEP` whose accumulated noise
a = η·C·σ_eff·√T / (m·(1 − β)) stays at :data:`~fedpriv.plan.noise_figure.A_TARGET`. The plan
maximises the progress P = T·η·C (full-size server steps under the noise budget); plans within 5%
of the best P tie, and are broken toward the smaller a (to 1e-9: every noise-limited plan sits at
A_TARGET), then at least :data:`PREFERRED_ROUNDS` rounds, then the Gaussian mechanism (the simpler
one), then the most progress. Where the noise
limits the step, P = a·m·(1 − β)·√T/σ_eff is flat over a wide range of cohorts: at moderate ε a
larger cohort is almost free in ε ("TAN Without a Burn: Scaling Laws of DP-SGD"; "Scaling Laws for
Differentially Private Language Models"), and
cumulative noise, not one step's, decides ("On Optimal Hyperparameters for Differentially Private
Deep Transfer Learning"). Momentum β = 0.9 and C = 1 are fixed ("Federated Learning of Gboard
Language Models with Differential Privacy"; "Adaptive Federated Optimization": the server step is
η·C once every update is clipped).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Literal, Optional

from fedpriv.accounting import calibrate_noise_multiplier
from fedpriv.accounting.ledger import prefix_claim_settings
from fedpriv.accounting.monte_carlo import MC, MonteCarloSettings
from fedpriv.errors import ConfigError
from fedpriv.optim.server import MomentumOptimizer
from fedpriv.plan.noise_figure import A_TARGET, accumulated_noise, iterate_noise_factor
from fedpriv.plan.pretrain_plan import PretrainChoice, plan_pretraining
from fedpriv.sampling import make_sampler
from fedpriv.schema import PlanOption, load, register_option
from fedpriv.schema.checks import positive

# (mechanism, sampling, accountant) the planner weighs: amplified BandMF under cyclic Poisson and the
# Gaussian under Poisson, both accounted by RDP (a grid point calibrates in well under a second), on the
# whole grid (stage 1); BandMF under balls-in-bins and under b-min-sep, accounted by Monte Carlo (seconds
# to minutes a point, cached), near the best stage-1 BandMF point only (stage 2, :func:`choose`)
CANDIDATES = (("gaussian", "poisson", "rdp"), ("bandmf", "cyclic_poisson", "rdp"),
              ("bandmf", "balls_in_bins", MC), ("bandmf", "b_min_sep", MC))
# stage 2 weighs a Monte-Carlo candidate only where its calibration is cheap: a balls-in-bins sample costs
# O(bins²) (the bins × bins Gram root), so at most MC_MAX_BINS bins; a b-min-sep sample O(rounds × bands),
# so at most MC_MAX_WORK of them, about the cost of MC_MAX_BINS bins (docs/PLANNER.md, "Amplified samplers")
MC_MAX_BINS = 128
MC_MAX_WORK = 512
MC_COHORTS = 2  # stage 2's cohorts: the best stage-1 BandMF point's and its better neighbour's
DEFAULT_MC = MonteCarloSettings()  # privacy.mc's defaults
MAX_STEP = 1.0  # η·C: the largest server step (docs/PLANNER.md, "Calibration runs")
MOMENTUM = 0.9  # server heavy-ball momentum
CLIP_NORM = 1.0  # C: with every update clipped only η·C matters; C = 1 keeps η the step
MIN_ROUNDS = 50  # fewer server steps than this lost on real text (cohort 500 × 30 rounds)
# among tied plans, those with at least this many rounds go first: on real text at ε = 8 the tied
# 61 × 81 plan ended at 0.0643 and 40 × 125 at 0.0732 (docs/RESULTS.md, "plan=auto at equal compute")
PREFERRED_ROUNDS = 100
MAX_ROUNDS = 2000
MIN_COHORT = 8
GRID_RATIO = 1.5
TIE = 0.95  # plans within 5% of the best progress are ties
# below one full-size server step in all, the run cannot move the model by one clipped update: it
# cannot train (the smallest planned run measured that learned made 13: docs/PLANNER.md)
MIN_SERVER_STEPS = 1.0
# below this share of a full-size step (the step from a random start), a plan stays well below a non-private run
# of its compute: on real text at epsilon 2 (0.42) planned runs kept 54% (74% with public pre-training) of the
# non-private accuracy, at epsilon 8 (0.73) 82% (docs/PLANNER.md)
KEEP_MOST_STEP = 0.5
# the keys of the executed config a plan chooses (the overrides it prints, less the public population)
CHOSEN_KEYS = ("cohort_size", "rounds", "mechanism", "sampling", "privacy.accountant", "privacy.clip_norm",
               "optimizer.lr", "optimizer.momentum", "optimizer.schedule")


@dataclass(frozen=True)
class Choice:
    """One grid point: its cohort and rounds, mechanism, σ and σ_eff, server step η·C, accumulated
    noise a and progress P = T·η·C."""

    cohort_size: int
    rounds: int
    mechanism: str
    sampling: str
    accountant: str
    noise_multiplier: float
    sigma_eff: float
    step: float
    accumulated_noise: float
    progress: float

    def at_noise(self, target: float) -> "Choice":
        """This grid point with the step that keeps the accumulated noise a at ``target`` instead
        (at most :data:`MAX_STEP`); cohort, rounds, mechanism and σ unchanged."""
        per_unit_step = self.accumulated_noise / self.step
        step = min(MAX_STEP, target / per_unit_step) if per_unit_step > 0 else MAX_STEP
        return dataclasses.replace(self, step=step, accumulated_noise=per_unit_step * step,
                                   progress=self.rounds * step)


@dataclass
class AutoPlan(PlanOption):
    """``plan=auto`` (module docstring)."""

    name: str = "auto"
    # compute budget U: expected cohort x rounds <= U (null: the configured cohort_size x rounds)
    client_updates: Optional[int] = None
    # auto: with a public corpus, plan its round-0 pre-training and the step after it
    # (fedpriv/plan/pretrain_plan.py); off: leave the public.* settings as given
    pretrain: Literal["auto", "off"] = "auto"

    def check(self, path: str) -> None:
        positive(self, "client_updates", path=path)

    def apply(self, spec, population: Optional[int], dimension: int,
              public_pool: Optional[int] = None) -> tuple[Any, Optional[dict]]:
        """The executed config: the configured one with the chosen cohort, rounds, mechanism,
        sampler, accountant, clip bound and server step, the public pre-training where a public
        corpus of ``public_pool`` sentences is configured, and ``plan.client_updates`` resolved (so
        that applying it again returns it unchanged); and the choice with its prediction."""
        _check_plannable(spec, population)
        budget = self.client_updates or spec.cohort_size * spec.rounds
        # the run's own Monte-Carlo settings (the planned σ is the run's σ); none under client.dp=example, whose
        # clients account their example-level DP with privacy.accountant (Poisson-sampled steps: not Monte Carlo)
        settings = MonteCarloSettings.of(spec.privacy.mc) if spec.client.dp == "none" else None
        best = choose(population, dimension, spec.privacy.target_epsilon, spec.privacy.delta, budget, settings)
        pretraining = plan_pretraining(public_pool, self.pretrain, spec.public.teacher)
        if pretraining.steps > 0:  # the private choice is kept; only the step follows the pre-trained start
            best = best.at_noise(pretraining.accumulated_noise)
        population = spec.population or population  # the rates' N: public, so add/remove-one holds
        mechanism = load("mechanism", {"name": best.mechanism}).fitted(population, best.cohort_size, best.rounds,
                                                                         best.sampling)
        optimizer = dataclasses.replace(spec.optimizer, lr=best.step / CLIP_NORM, momentum=MOMENTUM, schedule="cosine")
        privacy = dataclasses.replace(spec.privacy, accountant=best.accountant, clip_norm=CLIP_NORM)
        public = spec.public
        if pretraining.planned:  # the plan decides pre-training (0 steps: none)
            public = dataclasses.replace(public, **pretraining.settings())
        planned = dataclasses.replace(spec, cohort_size=best.cohort_size, rounds=best.rounds, sampling=best.sampling,
                                      population=population, mechanism=mechanism, optimizer=optimizer, privacy=privacy,
                                      public=public, plan=dataclasses.replace(self, client_updates=budget))
        return planned, describe(best, population, dimension, budget, spec.privacy.delta, settings, pretraining)


def _check_plannable(spec, population: Optional[int]) -> None:
    """What the rule assumes: a public population, and what :func:`refusal` checks."""
    if population is None:
        raise ConfigError("plan=auto plans from public quantities only: set population=N, the public number of "
                          "users (the data's own count is private under add/remove-one neighbours)")
    reason = refusal(spec)
    if reason is not None:
        raise ConfigError(reason)


def refusal(spec) -> Optional[str]:
    """Why ``plan=auto`` cannot plan ``spec`` whatever its population (None: it can): the rule
    assumes σ calibrated to a target ε, a heavy-ball server step, user-level DP through clients, a
    fixed clip bound and noise added by the server."""
    if spec.privacy.noise_multiplier is not None:
        return "plan=auto calibrates sigma to privacy.target_epsilon: leave privacy.noise_multiplier=null"
    if not isinstance(spec.optimizer, MomentumOptimizer):
        return f"plan=auto sets the step of optimizer=momentum, not optimizer={spec.optimizer.name}"
    if spec.algorithm.central:
        return f"plan=auto plans user-level federated rounds, not algorithm={spec.algorithm.name}"
    if spec.privacy.clipping != "fixed":
        return "plan=auto sets a fixed clip bound: use privacy.clipping=fixed with it"
    if spec.mechanism.client_noise:  # the planner picks a server-noise mechanism: never swap the trust model
        return (f"plan=auto chooses among server-noise mechanisms; mechanism={spec.mechanism.name} (noise added by "
                "the parties) is not planned: use plan=fixed with it")
    return None


def grid_problem(population: int, budget: int) -> str | None:
    """Why :func:`cohort_grid` is empty for N = ``population`` users and U = ``budget`` client updates
    (None: it is not): a cohort holds MIN_COHORT ≤ m ≤ N/4 users and runs MIN_ROUNDS ≤ U/m ≤ MAX_ROUNDS
    rounds, so N ≥ 4·MIN_COHORT and MIN_ROUNDS·MIN_COHORT ≤ U ≤ MAX_ROUNDS·⌊N/4⌋."""
    problems = []
    if population // 4 < MIN_COHORT:
        problems.append(f"population={population} is too small: plan=auto draws cohorts of at least {MIN_COHORT} "
                        f"from at most a quarter of the users, so it needs at least {4 * MIN_COHORT} users")
    if budget < MIN_ROUNDS * MIN_COHORT:
        problems.append(f"the budget plan.client_updates={budget} is too small: at least {MIN_ROUNDS * MIN_COHORT} "
                        f"({MIN_ROUNDS} rounds of cohorts of {MIN_COHORT})")
    elif population // 4 >= MIN_COHORT and math.ceil(budget / MAX_ROUNDS) > population // 4:
        problems.append(f"the budget plan.client_updates={budget} is too large for {population} users: at most "
                        f"{MAX_ROUNDS * (population // 4)} ({MAX_ROUNDS} rounds of cohorts of at most a quarter of "
                        "the users)")
    return "; and ".join(problems) or None


def cohort_grid(population: int, budget: int) -> list[int]:
    """Cohorts m with MIN_ROUNDS ≤ ⌊U/m⌋ ≤ MAX_ROUNDS and m ≤ N/4, geometric by GRID_RATIO."""
    low = max(MIN_COHORT, math.ceil(budget / MAX_ROUNDS))
    high = min(population // 4, budget // MIN_ROUNDS)
    grid, m = [], float(low)
    while round(m) <= high:
        if not grid or round(m) != grid[-1]:
            grid.append(round(m))
        m *= GRID_RATIO
    return grid


def evaluate(mechanism: str, sampling: str, accountant: str, population: int, cohort: int, rounds: int,
             epsilon: float, delta: float, mc: MonteCarloSettings | None = None) -> Choice:
    """The grid point (cohort, rounds) for one candidate: σ calibrated with the mechanism's own
    DpEvent (accounting only: no key, no noise), σ_eff, and the step that keeps a at A_TARGET.
    ``mc``: the run's Monte-Carlo settings (``privacy.mc``), shared over the run's prefix claims as
    the run's own calibration shares them, so that the planned σ is the run's σ."""
    option, sampler = _sampler(mechanism, sampling, population, cohort, rounds)
    built = option.build(1.0, 1.0, rounds=rounds, sampler=sampler)
    settings = prefix_claim_settings(mc or DEFAULT_MC, rounds) if accountant == MC else None
    sigma = calibrate_noise_multiplier(lambda s: built.dp_event(sampler, rounds, noise_multiplier=s), epsilon, delta,
                                       accountant, built.neighboring_relation(sampler), monte_carlo_settings=settings)
    sigma_eff = sigma * iterate_noise_factor(built, rounds)
    per_unit_step = accumulated_noise(sigma_eff, rounds, sampler.expected_cohort, 1.0, MOMENTUM)
    unit = Choice(cohort, rounds, mechanism, sampling, accountant, sigma, sigma_eff, 1.0, per_unit_step, rounds)
    return unit.at_noise(A_TARGET)


@functools.lru_cache(maxsize=16)
def choose(population: int, dimension: int, epsilon: float, delta: float, budget: int,
           mc: MonteCarloSettings | None = DEFAULT_MC) -> Choice:
    """The plan's grid point (module docstring). ``dimension`` does not enter the rule (a is per
    coordinate); it is stated with the prediction. Cached: its arguments are public values (``mc``:
    the run's Monte-Carlo settings; None: no Monte-Carlo candidate), and a run applies its plan more
    than once (the pre-flight, the run, a resume).

    Two stages: the RDP candidates on the whole grid, then the Monte-Carlo ones (:func:`_amplified`)
    near the best stage-1 BandMF point only. Among tied plans a Monte-Carlo row comes after the
    RDP ones (:func:`preference`)."""
    grid = cohort_grid(population, budget)
    if not grid:
        raise ConfigError(f"plan=auto cannot plan: {grid_problem(population, budget)}")
    rows = []
    for cohort in grid:
        rounds = min(MAX_ROUNDS, budget // cohort)
        for mechanism, sampling, accountant in CANDIDATES:
            if accountant == MC:
                continue  # stage 2
            try:
                rows.append(evaluate(mechanism, sampling, accountant, population, cohort, rounds, epsilon, delta))
            except ConfigError:
                continue  # a pattern this mechanism cannot account (e.g. too few groups for its bands)
    if not rows:
        raise ConfigError(f"plan=auto found no mechanism it can account for cohorts of {grid[0]}-{grid[-1]} from "
                          f"{population} users: give a larger population or plan.client_updates")
    if mc is not None:
        rows += _amplified(rows, grid, population, epsilon, delta, budget, mc)
    top = max(row.progress for row in rows)
    ties = [row for row in rows if row.progress >= TIE * top]
    return min(ties, key=preference)


def preference(row: Choice) -> tuple:
    """The order among tied plans (within 5% of the best progress; smallest first): the smaller a
    (to 1e-9: a is A_TARGET up to rounding on every noise-limited row), at least PREFERRED_ROUNDS
    rounds, the Gaussian mechanism, an RDP row before a Monte-Carlo one (its run claims ε by
    sampling, minutes, and with a stated probability: it must win by more than a tie), then the
    most progress."""
    return (round(row.accumulated_noise, 9), row.rounds < PREFERRED_ROUNDS, row.mechanism != "gaussian",
            row.accountant == MC, -row.progress)


def _amplified(rows: list[Choice], grid: list[int], population: int, epsilon: float, delta: float, budget: int,
               mc: MonteCarloSettings) -> list[Choice]:
    """Stage 2: the Monte-Carlo candidates at :data:`MC_COHORTS` grid cohorts — the best stage-1
    BandMF point's (most progress; P is flat near it) and its neighbour with more stage-1 progress —
    where they are cheap (:func:`mc_cost_problem`). Rounds: ⌊U / expected cohort⌋ (balls-in-bins'
    expected cohort N/⌊N/m⌋ exceeds m), within MIN_ROUNDS..MAX_ROUNDS."""
    candidates = [c for c in CANDIDATES if c[2] == MC]
    anchors = [row for row in rows if row.mechanism == "bandmf"] or rows
    if not candidates or not anchors:
        return []
    best = {}
    for row in rows:
        best[row.cohort_size] = max(best.get(row.cohort_size, 0.0), row.progress)
    i = grid.index(max(anchors, key=lambda row: row.progress).cohort_size)
    neighbours = [j for j in (i - 1, i + 1) if 0 <= j < len(grid)]
    cohorts = [grid[i], *sorted((grid[j] for j in neighbours), key=lambda m: -best.get(m, 0.0))][:MC_COHORTS]
    out = []
    for cohort in cohorts:
        for mechanism, sampling, accountant in candidates:
            try:
                rounds = _rounds(mechanism, sampling, population, cohort, budget)
                if rounds is None or mc_cost_problem(mechanism, sampling, population, cohort, rounds):
                    continue
                out.append(evaluate(mechanism, sampling, accountant, population, cohort, rounds, epsilon, delta, mc))
            except ConfigError:
                continue  # not accountable here (e.g. the samples cannot resolve δ, bands over the groups)
    return out


def _sampler(mechanism: str, sampling: str, population: int, cohort: int, rounds: int):
    """The mechanism option fitted to (N, m, T) and its key-less sampler (accounting only)."""
    option = load("mechanism", {"name": mechanism}).fitted(population, cohort, rounds, sampling)
    return option, make_sampler(sampling, population, cohort, None, groups=option.sampling_groups(),
                                public_population=population)


def _rounds(mechanism: str, sampling: str, population: int, cohort: int, budget: int) -> int | None:
    """⌊U / expected cohort⌋ rounds (at most MAX_ROUNDS; None below MIN_ROUNDS)."""
    expected = _sampler(mechanism, sampling, population, cohort, MAX_ROUNDS)[1].expected_cohort
    rounds = min(MAX_ROUNDS, math.floor(budget / expected + 1e-9))
    return rounds if rounds >= MIN_ROUNDS else None


def mc_cost_problem(mechanism: str, sampling: str, population: int, cohort: int, rounds: int) -> str | None:
    """Why stage 2 does not weigh this Monte-Carlo point (None: it does): more than MC_MAX_BINS
    bins (balls-in-bins) or more than MC_MAX_WORK rounds × bands (b-min-sep)."""
    option, sampler = _sampler(mechanism, sampling, population, cohort, rounds)
    bins = getattr(sampler, "bins", None)
    if sampling == "balls_in_bins" and bins is not None and bins > MC_MAX_BINS:
        return f"{bins} bins > MC_MAX_BINS={MC_MAX_BINS}"
    bands = option.sampling_groups() or 1
    if sampling == "b_min_sep" and rounds * bands > MC_MAX_WORK:
        return f"{rounds} rounds x {bands} bands > MC_MAX_WORK={MC_MAX_WORK}"
    return None


# the plan's entries the privacy claim rests on (privacy.json's ``plan``): the rest (the server step,
# the prediction, the public pre-training) is post-processing, recorded in summary.json only
ACCOUNTING_KEYS = ("rule", "client_updates", "population", "dimension", "cohort_size", "rounds", "mechanism",
                   "sampling", "accountant", "clip_norm", "noise_multiplier", "sigma_eff", "claim")


def accounting_part(plan: Optional[dict]) -> Optional[dict]:
    """The entries of ``plan`` (:func:`describe`) the ledger's claim rests on (None: no plan): the
    same with and without public pre-training."""
    return None if plan is None else {key: plan[key] for key in ACCOUNTING_KEYS if key in plan}


def describe(choice: Choice, population: int, dimension: int, budget: int, delta: float | None = None,
             mc: MonteCarloSettings | None = None, pretraining: PretrainChoice | None = None) -> dict:
    """The plan as summary.json records it (privacy.json: its :func:`accounting_part`), with its
    prediction: the noise norm of one averaged update over the clip bound, the accumulated noise a,
    the full-size server steps P and the epochs over the population; under the Monte-Carlo
    accountant also ``claim``: the settings its claims are made at (the σ grid's and the prefix
    claims' share of the confidence: :meth:`MonteCarloSettings.describe`); and the public
    pre-training."""
    plan = {"rule": "plan=auto (docs/PLANNER.md)", "client_updates": budget, "population": population,
            "dimension": dimension, "cohort_size": choice.cohort_size, "rounds": choice.rounds,
            "mechanism": choice.mechanism, "sampling": choice.sampling, "accountant": choice.accountant,
            "clip_norm": CLIP_NORM, "server_lr": choice.step / CLIP_NORM, "momentum": MOMENTUM,
            "noise_multiplier": choice.noise_multiplier, "sigma_eff": choice.sigma_eff,
            "prediction": {"averaged_noise_norm_to_clip": choice.noise_multiplier * math.sqrt(dimension)
                           / choice.cohort_size, "accumulated_noise": choice.accumulated_noise,
                           "server_steps": choice.progress, "epochs": choice.cohort_size * choice.rounds / population,
                           "regime": "step-limited" if choice.step >= MAX_STEP else "noise-limited"}}
    if choice.accountant == MC and delta is not None:
        plan["claim"] = prefix_claim_settings((mc or DEFAULT_MC).calibrated(), choice.rounds).describe(delta)
    if pretraining is not None:
        plan["public"] = pretraining.describe()
    return plan


def overrides(plan: dict) -> list[str]:
    """The command-line overrides that give a fixed run the planned config (the public population
    included: it fixes the rates and the add/remove-one relation; the learning rate exactly): one
    for each of :data:`CHOSEN_KEYS`."""
    values = dict(zip(CHOSEN_KEYS, (plan["cohort_size"], plan["rounds"], plan["mechanism"], plan["sampling"],
                                    plan["accountant"], repr(plan["clip_norm"]), repr(plan["server_lr"]),
                                    repr(plan["momentum"]), "cosine")))
    public = plan.get("public")
    if public and public["planned"]:
        values.update((f"public.{key}", repr(value)) for key, value in PretrainChoice(**public).settings().items())
    return [f"population={plan['population']}", *(f"{key}={value}" for key, value in values.items())]


def scratch_step_share(plan: dict) -> float:
    """The share of a full-size step (:data:`MAX_STEP`) the noise leaves the server step of the plan
    from a random start (at :data:`A_TARGET`, whatever the pre-training): 1 when step-limited."""
    step, a = plan["server_lr"] * plan["clip_norm"], plan["prediction"]["accumulated_noise"]
    return 1.0 if a <= 0 else min(MAX_STEP, step * A_TARGET / a) / MAX_STEP


def far_from_nonprivate(plan: dict, epsilon: float) -> str | None:
    """The line that says a plan will stay well below a non-private run of the same compute (None:
    it need not): the noise leaves its server step under :data:`KEEP_MOST_STEP` of a full-size
    step, so it makes under half the progress a non-private run makes (docs/PLANNER.md, "When the
    plan says it cannot keep most of the non-private model": what such plans kept, measured)."""
    share = scratch_step_share(plan)
    if share >= KEEP_MOST_STEP:
        return None
    public = plan.get("public") or {}
    hint = "" if public.get("steps") else "; public pre-training (data.public_source) narrows it"
    return (f"plan=auto: at epsilon {epsilon:g} the noise over {plan['population']} users leaves the server step "
            f"{share:.2f} of a full-size step ({share * plan['rounds']:.3g} of the {plan['rounds']} full steps a "
            "non-private run of this compute makes): expect well under the non-private model's accuracy (too few "
            "users for this epsilon; docs/PLANNER.md); more users (population) or a larger privacy.target_epsilon "
            f"close the gap{hint}")


def cannot_train(plan: dict, epsilon: float) -> str | None:
    """The line that says a plan cannot train (None: it can): fewer than :data:`MIN_SERVER_STEPS`
    full-size server steps P = T·η·C in all, so the model cannot move by one clipped update."""
    steps = plan["prediction"]["server_steps"]
    if steps >= MIN_SERVER_STEPS:
        return None
    return (f"plan=auto: the best plan makes {steps:.3g} full-size server steps in all (the noise at epsilon "
            f"{epsilon:g} limits its step to {plan['server_lr'] * plan['clip_norm']:.3g}): under {MIN_SERVER_STEPS:g} "
            "the model cannot train; raise privacy.target_epsilon, population (more users) or plan.client_updates")


def plan_warning(plan: dict, epsilon: float) -> str | None:
    """The one warning a plan gets before it runs (None: none): that it cannot train
    (:func:`cannot_train`), else that it stays well below non-private (:func:`far_from_nonprivate`)."""
    return cannot_train(plan, epsilon) or far_from_nonprivate(plan, epsilon)


register_option("plan", "auto", AutoPlan())
