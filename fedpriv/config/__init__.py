"""A run's config: composing Hydra's tree as a plain dict, and resolving/validating the typed config
(the schema itself is fedpriv.schema)."""
