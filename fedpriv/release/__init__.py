"""What a run releases and how: the run directory and its atomic writes, which files a run writes, per-
round observability (structured lines, TensorBoard) and the console's format."""
