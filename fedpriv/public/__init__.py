"""Public-data pipeline: tokenizers trained on public text (more to come: pre-training,
distillation, distribution-matching mid-training)."""
