"""A run's plan (:mod:`fedpriv.plan.run_plan`): what its configuration and its data's public
quantities decide before any key is drawn or file written; ``plan=auto`` (:mod:`fedpriv.plan.auto`)
chooses the cohort, rounds, mechanism, clip and server step from public quantities as its first step."""

from fedpriv.plan.run_plan import (RunPlan, build_plan, executed_config, fit_to_population,  # noqa: F401
                                   preflight, preflight_sweep)
