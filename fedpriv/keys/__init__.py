"""Randomness and keys: the run key, its named streams, the ChaCha20 keystream, and what a research key
covers (a config's canonical form, an input's content digest)."""
