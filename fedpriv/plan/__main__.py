"""``python -m fedpriv.plan [+experiment=NAME] [key=value ...] [--json]``: the plan of a run, without
training — what ``plan=auto`` (added unless the line names a ``plan``) chooses from public
quantities, its prediction, and the overrides that give a fixed run the same config.

    python -m fedpriv.plan data.synthetic.num_users=2000 plan.client_updates=5000
    python -m fedpriv.plan data=stackoverflow data.path=so.sqlite population=342477 --json

Nothing is written and no key is drawn (:func:`fedpriv.plan.preflight`); the data is loaded only
for the checks a run makes (the cohort against the population, Book-Keeping's support of the model).
Bad input: one ``error:`` line, exit 2, as ``python -m fedpriv.simulate`` words it (the same checks
of the command line, and a setting typed beside ``plan=auto`` that the plan would replace). A plan
that cannot train (under one full-size server step in all) is printed with a ``warning:`` line, as
are dp_accounting's warnings (:func:`fedpriv.release.console.console_logging`; its notes of excluded RDP
orders are dropped where they are logged, :mod:`fedpriv.accounting.accountant`).
"""

from __future__ import annotations

import sys

from fedpriv.config.compose import check_overrides
from fedpriv.release.console import console_logging, fail
from fedpriv.errors import ConfigError, PrivacyBudgetExceeded
from fedpriv.plan.auto import overrides, plan_warning
from fedpriv.plan.run_plan import preflight
from fedpriv.release.result_lines import monte_carlo_bound
from fedpriv.release.rundir import json_text
from fedpriv.sampling import participation_lines


def pretraining_line(public: dict | None) -> str:
    """What the plan chose for round-0 public pre-training, and why."""
    if not public or public["steps"] == 0:
        return "public pre-training: none (" + (public["reason"] if public else "not planned") + ")"
    return (f"public pre-training: {public['steps']} steps of {public['batch_size']} sentences at lr "
            f"{public['lr']:g}: {public['reason']}")


def lines(plan) -> list[str]:
    """The plan in a few lines: the choice, its prediction, the overrides."""
    choice, spec = plan.choice, plan.spec
    settings = plan.ledger.monte_carlo  # the Monte-Carlo accountant's claims hold with a stated probability
    claim = "" if settings is None else " " + monte_carlo_bound(settings.confidence)
    head = (f"plan: cohort {spec.cohort_size} x {spec.rounds} rounds, {spec.mechanism.name} noise under "
            f"{spec.sampling} sampling ({spec.privacy.accountant} accountant), sigma {plan.noise_multiplier:.4g} "
            f"(z/m {plan.ledger.averaged_noise_to_clip:.3g}: the noise per coordinate of the averaged update, in clip "
            f"bounds) for epsilon {spec.privacy.target_epsilon:g} at delta {spec.privacy.delta:g}{claim}; "
            f"clip {spec.privacy.clip_norm:g}, server lr {getattr(spec.optimizer, 'lr', float('nan')):.4g}")
    out = [head, *participation_lines(plan.ledger.sampler, spec.rounds, spec.cohort_size)]
    if choice is not None:
        p = choice["prediction"]
        out.append(f"prediction: accumulated noise a {p['accumulated_noise']:.3g} per coordinate, "
                   f"{p['server_steps']:.4g} full-size server steps, {p['epochs']:.3g} epochs over the "
                   f"{choice['population']} users, one averaged update's noise {p['averaged_noise_norm_to_clip']:.3g} "
                   f"x the clip bound in norm ({p['regime']})")
        out.append(pretraining_line(choice.get("public")))
        out.append("overrides: " + " ".join(overrides(choice)))
    return out


def main(argv: list[str] | None = None) -> None:
    console_logging()  # dp_accounting's warnings as warning: lines (its excluded-order notes are dropped)
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    args = [a for a in args if a != "--json"]
    if any(a in ("-h", "--help") for a in args):
        print(__doc__.strip())
        return
    if not any(a.lstrip("+~").startswith("plan=") for a in args):
        args.append("plan=auto")
    try:
        members = check_overrides(args, multirun=True)
        if len(members) > 1:
            raise ConfigError(f"python -m fedpriv.plan plans one run, not a sweep of {len(members)}: give each key "
                              "one value")
        _, plain, typed = members[0]
        plan = preflight(plain, typed)
    except (ConfigError, PrivacyBudgetExceeded) as err:
        fail(str(err))
    warning = plan.choice and plan_warning(plan.choice, plan.spec.privacy.target_epsilon)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    if as_json:
        print(json_text({**plan.describe(), "plan": plan.choice,
                         "overrides": overrides(plan.choice) if plan.choice else []}, indent=2))
    else:
        print("\n".join(lines(plan)))


if __name__ == "__main__":
    main()
