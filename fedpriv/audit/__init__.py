"""Empirical privacy audit of a run: canary units (:mod:`fedpriv.audit.canaries`), their scores,
a one-run lower bound on ε (:mod:`fedpriv.audit.bound`) and a Gaussian-fit estimate
(:mod:`fedpriv.audit.estimate`); ``audit.canaries=M``, ``python -m fedpriv.audit``,
docs/PRIVACY.md. The package's ``__init__`` imports nothing, so importing one module does not load the others."""
