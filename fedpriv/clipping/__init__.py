"""Per-sample clipping with the Book-Keeping (BK) algorithm (ghost norms + book-kept sums).

``BookKeeping(model, clip_norm, noise_multiplier, mode, noise_key)`` hooks a model built from
supported layers (``RULES``; :func:`validate` lists every problem with a model, without raising);
``bk.backward(per_sample_loss, groups=None)`` sets clipped and noised gradients (noise from a secret
ChaCha20 keystream, :class:`GaussianKeystream`). Which rows are per sample is proven by
:mod:`fedpriv.clipping.provenance` (:func:`computed_from` and :func:`flat_positions` declare what
autograd cannot see), and that the forward mixes no samples by :mod:`fedpriv.clipping.replay`. Add a
layer type with :func:`register_rule` (model packages register their own composite modules' rules when
imported; this package imports no model).
"""

from fedpriv.clipping.engine import MODES, BookKeeping, record_call, validate
from fedpriv.keys.keystream import GaussianKeystream
from fedpriv.clipping.provenance import UnsupportedLayerError, computed_from, flat_positions
from fedpriv.clipping.rules import HINTS, RULES, LayerRule, no_contributions, register_hint, register_rule

__all__ = ["BookKeeping", "GaussianKeystream", "HINTS", "LayerRule", "MODES", "RULES", "UnsupportedLayerError",
           "computed_from", "flat_positions", "no_contributions", "record_call", "register_hint", "register_rule",
           "validate"]
