"""Public data (no privacy cost): the teacher, distillation, and the stages of a run that use
public data — round-0 pre-training and distribution-matching mid-training (``stages.py``; a new
stage's module is imported here so that it registers itself)."""

from fedpriv.public import stages  # noqa: F401 (registers the built-in stages)
