"""Per-sample clipping with the Book-Keeping (BK) algorithm (ghost norms + book-kept sums).

``BookKeeping(model, clip_norm, noise_multiplier, mode, generator)`` hooks a model built from
supported layers (``RULES``); ``bk.backward(per_sample_loss, groups=None)`` sets clipped and noised
gradients. Add a layer type with :func:`register_rule` (model packages register their own
composite modules' rules when imported; this package imports no model).
"""

from fedpriv.clipping.engine import (MODES, BookKeeping, UnsupportedLayerError, computed_from, flat_positions,
                                    record_call)
from fedpriv.clipping.noise import add_gaussian_
from fedpriv.clipping.rules import HINTS, RULES, LayerRule, no_contributions, register_hint, register_rule

__all__ = ["BookKeeping", "HINTS", "LayerRule", "MODES", "RULES", "UnsupportedLayerError", "add_gaussian_",
           "computed_from", "flat_positions", "no_contributions", "record_call", "register_hint", "register_rule"]
