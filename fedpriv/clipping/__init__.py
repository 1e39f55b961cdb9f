"""Per-sample clipping with the Book-Keeping (BK) algorithm (ghost norms + book-kept sums).

``BookKeeping(model, clip_norm, noise_multiplier, mode, noise_key)`` hooks a model built from
supported layers (``RULES``); ``bk.backward(per_sample_loss, groups=None)`` sets clipped and noised
gradients (noise from a secret ChaCha20 keystream, :class:`GaussianKeystream`). Add a layer type
with :func:`register_rule` (model packages register their own composite modules' rules when
imported; this package imports no model).
"""

from fedpriv.clipping.engine import (MODES, BookKeeping, UnsupportedLayerError, computed_from, flat_positions,
                                    record_call)
from fedpriv.clipping.noise import GaussianKeystream
from fedpriv.clipping.rules import HINTS, RULES, LayerRule, no_contributions, register_hint, register_rule

__all__ = ["BookKeeping", "GaussianKeystream", "HINTS", "LayerRule", "MODES", "RULES", "UnsupportedLayerError",
           "computed_from", "flat_positions", "no_contributions", "record_call", "register_hint", "register_rule"]
