"""RDP → (ε, δ) by dp_accounting's conversion, refusing an RDP vector it would read as ε = 0.

Every RDP path of fedpriv (the ``rdp`` accountant's ε and δ, the ledger's per-round ε, the
distributed discrete Gaussian's ε) converts through :func:`epsilon_from_rdp` or
:func:`delta_from_rdp`, never through dp_accounting's ``get_epsilon``/``get_delta`` directly.

Why: dp_accounting's conversion takes a *negative* RDP value at an order as ε = 0 at that order
(δ = 0 in ``compute_delta``; it logs "Negative Renyi divergence ... Returning an epsilon of zero"),
and ε is the minimum over the orders, so one such order makes the whole answer 0. A Rényi
divergence is never negative: a negative value is floating-point cancellation where the true value
lies below the resolution of its computation. For the Poisson-sampled Gaussian (RDP about
αq²/(2σ²) at sampling rate q, noise σ) dp_accounting's log-sum of A_α's binomial terms turns
negative at some default orders from σ ≈ 2e5 at q = 1e-4 (8e7 at q = 0.5). Dropping only the
negative orders (ε as the minimum over the others) is *not* sound: the other orders of that
vector carry an error of the same absolute size, so they may sit far below their true values too
(against 80-digit arithmetic at the integer orders: relative errors beyond ±100% wherever an
order is negative; such a vector scaled by a large count gives, with its negative orders dropped,
ε = 0.96 where exact arithmetic gives at least 4.3). So a vector with any negative (or NaN) entry
is refused with :class:`RdpBelowResolution`. A +∞ entry (an order dp_accounting excluded) is
kept: the other orders' bounds are each valid on their own. Not detected: the error of a vector
with no negative entry (up to 80% just short of the first negative order; docs/PRIVACY.md states
what that allows).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from dp_accounting.rdp.rdp_privacy_accountant import compute_delta, compute_epsilon

from fedpriv.errors import ConfigError


class RdpBelowResolution(ConfigError):
    """An RDP vector with a negative (or NaN) entry: below its computation's floating-point
    resolution, so no ε or δ is stated from it (module docstring)."""


def check_rdp(orders: Sequence[float], rdp: Sequence[float], what: str, hint: str = "") -> np.ndarray:
    """``rdp`` as an array, after checking every entry is ≥ 0 or +∞; else :class:`RdpBelowResolution`
    naming ``what`` (the event), the first bad order and value, and ``hint`` (what to use instead)."""
    values = np.asarray(rdp, dtype=np.float64)
    bad = np.flatnonzero(~(values >= 0))
    if len(bad):
        i = int(bad[0])
        raise RdpBelowResolution(
            f"the RDP of {what} is below floating-point resolution ({len(bad)} of {len(values)} orders negative "
            f"or NaN, e.g. {values[i]:.3g} at order {float(np.asarray(orders)[i]):g}; a Rényi divergence is never "
            f"negative), so no epsilon or delta is stated from it{hint}")
    return values


def epsilon_from_rdp(orders: Sequence[float], rdp: Sequence[float], delta: float, what: str,
                     hint: str = "") -> float:
    """ε at ``delta`` from RDP ``rdp`` at ``orders`` (dp_accounting's improved conversion, the
    minimum over orders of ``r + log(1 − 1/α) − log(δα)/(α − 1)``, or 0 where the KL bound
    ``√(1 − e^{−r}) ≤ δ`` holds), after :func:`check_rdp`."""
    return float(compute_epsilon(orders, check_rdp(orders, rdp, what, hint), delta)[0])


def delta_from_rdp(orders: Sequence[float], rdp: Sequence[float], epsilon: float, what: str,
                   hint: str = "") -> float:
    """δ at ``epsilon`` from RDP ``rdp`` at ``orders`` (dp_accounting's conversion), after
    :func:`check_rdp`."""
    return float(compute_delta(orders, check_rdp(orders, rdp, what, hint), epsilon)[0])
