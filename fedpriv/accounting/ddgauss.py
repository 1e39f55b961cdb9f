"""Accounting of the distributed discrete Gaussian (issue 45, first step: the mathematics).

Kairouz, Liu and Steinke, "The Distributed Discrete Gaussian Mechanism for Federated Learning with
Secure Aggregation" (ICML 2021). Each of ``n`` clients clips its update to L2 norm ``c``, rotates
it (randomized Hadamard), scales it by ``1/γ``, rounds it to the integer grid by conditional
randomized rounding, and adds its own share ``N_Z(0, σ²)`` of discrete Gaussian noise per
coordinate; secure aggregation reveals only the sum (mod the field). In the scaled integer domain
(``σ`` below is the *local* standard deviation there, i.e. the real-valued one divided by γ):

* **Sensitivity after rounding** (the paper's conditional randomized rounding, its Theorem/
  Proposition on the rounded norm): rounding is retried until the rounded vector's squared norm
  is at most ``Δ₂² = min((c/γ + √d)², (c/γ)² + d/4 + √(2 ln(1/β))·(c/γ + √d/2))``, where ``β`` is
  the probability bound of one try failing (``β = 0``: the unconditional bound ``c/γ + √d``).
  In the integer domain also ``Δ₁ ≤ Δ₂·min(√d, Δ₂)``.
* **The sum of n shares is nearly a discrete Gaussian** (its Theorem 1 and Proposition 14): with
  ``τ = 10·Σ_{k=1}^{n−1} exp(−2π²σ²·k/(k+1))``, ``s₂ = Δ₂/(√n σ)`` and ``s₁ = Δ₁/(√n σ)``, one
  round satisfies (α, ε(α))-RDP for every α > 1 with
  ``ε(α) = min(α s₂²/2 + τd,  α(s₂² + 2 s₁ τ + τ² d)/2,  α(s₂ + τ√d)²/2)``.
  The bound needs ``σ ≥ 1/2`` (integer domain) when n > 1; below it this module charges ε = ∞.
  With ``n = 1`` (τ = 0) this is the discrete Gaussian's ``α s₂²/2``, the continuous Gaussian's
  RDP at noise multiplier ``σ/Δ₂`` (Canonne, Kamath and Steinke, "The Discrete Gaussian for
  Differential Privacy").
* **Poisson sampling** of the users with probability ``q`` amplifies it by the general upper bound
  of Zhu and Wang, "Poisson Subsampled Rényi Differential Privacy" (ICML 2019, Theorem 5), for
  integer α ≥ 2 (:func:`poisson_subsampled_rdp`); rounds compose additively in RDP, and ε at δ is
  dp_accounting's RDP conversion (through :func:`~fedpriv.accounting.rdp_conversion.epsilon_from_rdp`,
  which refuses an order whose computed bound is negative: floating-point cancellation at tiny q,
  which the conversion would read as ε = 0).

``n`` must be a number of shares the round is *guaranteed* to sum: fewer shares are less noise.
fedpriv's runs (:mod:`fedpriv.mechanisms.ddgauss`) take the shares from a fixed set of *parties*
(the secure-aggregation participants), each adding one share whether or not it holds a sampled
user, so the number of shares does not depend on the sampling or on the data, and a round with
fewer than ``n`` surviving shares is withheld (released as nothing; survival is assumed
independent of the data). Then the pair of worlds for user u — u sampled with probability q,
its rounded update (norm ≤ Δ₂) added to the same shares, against u absent — is the pair of
Poisson subsampling under add/remove of u, and under zero-out as well (u's zeroed update rounds
to exactly 0): Zhu–Wang's bound covers both. Were the shares instead one per *sampled user*,
the number of shares would move with u's participation and this pair would not hold.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import attr
import dp_accounting
import numpy as np
from scipy import special

from fedpriv.accounting.rdp_conversion import epsilon_from_rdp

#: the integer RDP orders the amplification bound is evaluated at (Theorem 5 needs integers ≥ 2)
ORDERS: tuple[int, ...] = tuple(range(2, 129)) + (192, 256)
#: conditional rounding's default failure bound per try (β = e^{−1/2}, as the paper's experiments)
BETA = math.exp(-0.5)
#: the widest field: the share sampler and the rotation compute in float64, whose integers are
#: exact to 2^53; at 2^44 levels the integer-domain σ and Δ₂ stay below 2^44 (9 bits of margin)
MAX_BITS = 44


def padded_dim(dim: int) -> int:
    """The rotation's size: the smallest power of two ≥ ``dim``."""
    if dim < 1:
        raise ValueError(f"dim must be at least 1, got {dim}")
    return 1 << (dim - 1).bit_length()


def rounded_l2_bound(scaled_clip: float, dim: int, beta: float) -> float:
    """Δ₂ of a vector of L2 norm ≤ ``scaled_clip`` (= c/γ) after conditional randomized rounding to
    the integer grid with failure probability bound ``beta`` ∈ [0, 1) (module docstring)."""
    if not scaled_clip > 0 or dim < 1 or not 0 <= beta < 1:
        raise ValueError(f"need scaled_clip > 0, dim >= 1 and 0 <= beta < 1 (got {scaled_clip}, {dim}, {beta})")
    plain = scaled_clip + math.sqrt(dim)
    if beta == 0:
        return plain
    conditional = math.sqrt(scaled_clip ** 2 + dim / 4
                            + math.sqrt(2 * math.log(1 / beta)) * (scaled_clip + math.sqrt(dim) / 2))
    return min(plain, conditional)


def rounded_l1_bound(l2_bound: float, dim: int) -> float:
    """Δ₁ of an integer vector of L2 norm ≤ ``l2_bound`` in ``dim`` coordinates: ≤ √d·Δ₂, and
    ≤ Δ₂² since every nonzero integer coordinate has |x| ≤ x²."""
    return l2_bound * min(math.sqrt(dim), l2_bound)


def tau(shares: int, local_std: float) -> float:
    """``τ = 10·Σ_{k=1}^{n−1} exp(−2π²σ²·k/(k+1))``: how far the sum of ``shares`` discrete
    Gaussians of standard deviation ``local_std`` (integer domain) is from one discrete Gaussian."""
    if shares < 1 or not local_std > 0:
        raise ValueError(f"need shares >= 1 and local_std > 0 (got {shares}, {local_std})")
    k = np.arange(1, shares, dtype=np.float64)
    return float(10.0 * np.exp(-2.0 * (math.pi * local_std) ** 2 * k / (k + 1)).sum())


def round_rdp(alpha: float, l1_scale: float, l2_scale: float, tau_value: float, dim: int) -> float:
    """ε(α) of one round of the distributed discrete Gaussian without sampling (Proposition 14;
    ``l*_scale`` = sensitivity / (√n σ), ``tau_value`` from :func:`tau`)."""
    if not alpha > 1:
        raise ValueError(f"RDP orders must exceed 1, got {alpha}")
    return min(alpha * l2_scale ** 2 / 2 + tau_value * dim,
               alpha * (l2_scale ** 2 + 2 * l1_scale * tau_value + tau_value ** 2 * dim) / 2,
               alpha * (l2_scale + math.sqrt(dim) * tau_value) ** 2 / 2)


def poisson_subsampled_rdp(alpha: int, q: float, rdp: Callable[[int], float]) -> float:
    """RDP at integer order ``alpha`` ≥ 2 of a mechanism with RDP curve ``rdp`` run on a Poisson
    sample of rate ``q``: Zhu and Wang's general upper bound (Theorem 5),
    ``(1/(α−1))·log[(1−q)^{α−1}(αq−q+1) + C(α,2)q²(1−q)^{α−2}e^{ε(2)}
    + 3·Σ_{l=3}^{α} C(α,l)(1−q)^{α−l}q^l e^{(l−1)ε(l)}]``, never above the unsampled ``rdp(α)``."""
    if int(alpha) != alpha or alpha < 2:
        raise ValueError(f"the subsampling bound needs an integer order >= 2, got {alpha}")
    if not 0 < q <= 1:
        raise ValueError(f"the sampling rate must be in (0, 1], got {q}")
    alpha = int(alpha)
    if q == 1:
        return rdp(alpha)
    log_q, log_1q = math.log(q), math.log1p(-q)
    head = [(alpha - 1) * log_1q + math.log(alpha * q - q + 1),
            math.log(special.comb(alpha, 2)) + 2 * log_q + (alpha - 2) * log_1q + rdp(2)]
    orders = np.arange(3, alpha + 1, dtype=np.float64)
    tail = (special.gammaln(alpha + 1) - special.gammaln(orders + 1) - special.gammaln(alpha - orders + 1)
            + (alpha - orders) * log_1q + orders * log_q + (orders - 1) * np.array([rdp(int(o)) for o in orders]))
    terms = np.concatenate([head, tail])
    weights = np.concatenate([[1.0, 1.0], np.full(len(tail), 3.0)])
    return min(float(special.logsumexp(terms, b=weights)) / (alpha - 1), rdp(alpha))


@dataclass(frozen=True)
class DistributedDiscreteGaussian:
    """One round's distributed discrete Gaussian, in the real domain of the updates.

    ``clip``: each client's L2 clip c; ``granularity``: γ (the integer grid's step in update
    units); ``local_std``: each share's standard deviation in update units (σ_real; the integer
    domain's σ is σ_real/γ); ``shares``: the number of shares every released sum is guaranteed to
    hold (the planned minimum of surviving clients); ``dim``: d, the coordinates after padding to
    the rotation's power of two; ``beta``: conditional rounding's failure bound."""

    clip: float
    granularity: float
    local_std: float
    shares: int
    dim: int
    beta: float = BETA

    def __post_init__(self) -> None:
        for name in ("clip", "granularity", "local_std"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.shares < 1 or self.dim < 1:
            raise ValueError(f"shares and dim must be at least 1 (got {self.shares}, {self.dim})")

    @property
    def l2_sensitivity(self) -> float:
        """Δ₂ in the integer domain (after scaling by 1/γ and rounding)."""
        return rounded_l2_bound(self.clip / self.granularity, self.dim, self.beta)

    def rdp_curve(self) -> Callable[[float], float]:
        """α ↦ ε(α) of one unsampled round (Proposition 14, in the integer domain), its constants
        (the scales and τ) computed once."""
        sigma = self.local_std / self.granularity
        l2 = self.l2_sensitivity
        spread = math.sqrt(self.shares) * sigma
        if self.shares > 1 and sigma < 0.5:  # Theorem 1 / Proposition 14 assume σ ≥ 1/2: no bound below
            return lambda alpha: math.inf
        l1_scale, l2_scale, t = rounded_l1_bound(l2, self.dim) / spread, l2 / spread, tau(self.shares, sigma)
        return lambda alpha: round_rdp(alpha, l1_scale, l2_scale, t, self.dim)

    def rdp(self, alpha: float) -> float:
        """ε(α) of one unsampled round (:meth:`rdp_curve`)."""
        return self.rdp_curve()(alpha)

    def epsilon(self, delta: float, rounds: int, q: float = 1.0, orders: Sequence[int] = ORDERS) -> float:
        """ε at ``delta`` after ``rounds`` rounds, each on a Poisson sample of rate ``q`` of the
        users (q = 1: every round sees every user), by RDP composition and dp_accounting's
        RDP → (ε, δ) conversion."""
        if rounds < 1 or not 0 < delta < 1:
            raise ValueError(f"need rounds >= 1 and 0 < delta < 1 (got {rounds}, {delta})")
        curve = self.rdp_curve()
        table = {order: curve(order) for order in range(2, max(orders) + 1)}  # each order's ε once
        rdp = [rounds * poisson_subsampled_rdp(order, q, table.__getitem__) for order in orders]
        return epsilon_from_rdp(list(orders), rdp, delta, "the distributed discrete Gaussian",
                                " (it is accounted by RDP only)")


def granularity_for_bits(clip: float, local_std: float, shares: int, dim: int, bits: int, k: float = 4.0,
                         flatness: float = 1.0, users: int | None = None) -> float:
    """The grid step γ at which ``k`` standard deviations of every coordinate of the centred sum
    fit in ``bits`` (the paper's modular-clipping heuristic, its Section 4): after the rotation a
    coordinate of the sum of ``users`` (default: ``shares``) clipped updates is sub-Gaussian with
    variance at most ``ρ·(c u)²/d`` (ρ the rotation's flatness, 1 for the randomized Hadamard up to
    a log factor; ``c u`` the sum's norm bound), each user's rounding adds at most γ²/4 and each of
    the ``shares`` noise shares σ², so ``2^bits = 2k·√(ρ(cu)²/d + u γ²/4 + nσ²)/γ``:
    ``γ = √((ρ(cu)²/d + nσ²) / (4^bits/(4k²) − u/4))``. ``ValueError`` when ``4^bits ≤ u k²``."""
    if not 2 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be in [2, {MAX_BITS}] (float64 sampling and rotation), got {bits}")
    users = shares if users is None else users
    room = 4.0 ** bits / (4 * k * k) - users / 4
    if not room > 0:
        raise ValueError(f"{bits} bits cannot hold {k} standard deviations of a sum of {users} rounded updates: "
                         f"give more bits (4^bits > u·k²)")
    return math.sqrt((flatness * (clip * users) ** 2 / dim + shares * local_std ** 2) / room)


def expected_wraps(clip: float, granularity: float, local_std: float, shares: int, dim: int, bits: int,
                   users: int, flatness: float = 1.0) -> float:
    """The expected number of coordinates of one round's sum that wrap around the field (fall
    outside the centred range ``[−m/2, m/2)``, m = 2^bits, and decode off by ``±m·γ``), at the
    size the field is planned for. The model of :func:`granularity_for_bits`: ``users`` clipped
    updates whose sum has norm ``c·users`` (the worst case: all aligned, at the clip), rotated so
    that a coordinate of the sum has variance ``ρ(c·users)²/(dγ²)`` on the grid; each user's rounding
    adds at most 1/4 and each of the ``shares`` shares ``(σ/γ)²``; every coordinate taken as Gaussian
    with that variance V (the noise is, the rotated sum nearly so for a flat sum): ``d·erfc(h/√2)``
    with ``h = (m/2)/√V``. At the planned grid step h is the headroom k, so this is
    ``d·erfc(k/√2)`` (k = 4: 6.3e-5 of the d coordinates). A smaller or less aligned sum wraps
    less; a sum of more users than planned, or a rotation that leaves a spike, more."""
    variance = (flatness * (clip * users) ** 2 / dim + shares * local_std ** 2) / granularity ** 2 + users / 4
    return dim * math.erfc(2.0 ** (bits - 1) / math.sqrt(variance) / math.sqrt(2.0))


def calibrate_local_std(epsilon: float, delta: float, clip: float, granularity: float, shares: int, dim: int,
                        rounds: int, q: float = 1.0, beta: float = BETA) -> float:
    """The smallest share standard deviation σ_real (bisection, to 0.1%) at which ``rounds`` rounds
    of :class:`DistributedDiscreteGaussian` with these settings cost at most ``epsilon`` at ``delta``."""
    def cost(std: float) -> float:
        return DistributedDiscreteGaussian(clip, granularity, std, shares, dim, beta).epsilon(delta, rounds, q)

    lo, hi = 1e-6 * clip, clip
    while cost(hi) > epsilon:
        lo, hi = hi, hi * 4
        if hi > 1e6 * clip:
            raise ValueError(f"no noise level reaches epsilon {epsilon} with these settings")
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if cost(mid) <= epsilon else (mid, hi)
    return hi


def plan_ddgauss(epsilon: float, delta: float, clip: float, shares: int, length: int, rounds: int, q: float,
                 bits: int, k: float = 4.0, beta: float = BETA, iterations: int = 8
                 ) -> DistributedDiscreteGaussian:
    """Grid step and share noise for an ε budget and a bit width: alternately the σ that meets ε
    at the current γ (:func:`calibrate_local_std`) and the γ at which k standard deviations of the
    sum fit the bits with that σ (:func:`granularity_for_bits`), from γ = the noise-free fit, until γ
    moves by less than 0.1%. The result meets ε (each σ is calibrated at its own γ); the bits hold
    k standard deviations of the sum at the returned γ up to that 0.1%. ``length``: the update's
    coordinates (padded to a power of two here)."""
    dim = padded_dim(length)
    gamma = granularity_for_bits(clip, 0.0, shares, dim, bits, k)
    std = calibrate_local_std(epsilon, delta, clip, gamma, shares, dim, rounds, q, beta)
    for _ in range(iterations):
        previous, gamma = gamma, granularity_for_bits(clip, std, shares, dim, bits, k)
        std = calibrate_local_std(epsilon, delta, clip, gamma, shares, dim, rounds, q, beta)
        if abs(gamma / previous - 1) < 1e-3:  # a fixed point: σ no longer moves γ
            return DistributedDiscreteGaussian(clip, gamma, std, shares, dim, beta)
    raise RuntimeError(f"the grid step did not settle in {iterations} iterations (last {gamma:.4g}, before "
                       f"{previous:.4g}): the bits' fit to k standard deviations is not established")


@attr.s(frozen=True, repr=False)
class DistributedDiscreteGaussianDpEvent(dp_accounting.DpEvent):
    """``rounds`` releases of the distributed discrete Gaussian's sum, each on a Poisson sample of
    rate ``sampling_rate`` of the users, for :func:`fedpriv.accounting.compute_epsilon` (dp_accounting's
    own accountants refuse it). In units of the clip norm: ``noise_multiplier`` = √n·σ/c, the summed
    shares' standard deviation per unit of clip (each share σ = noise_multiplier·c/√n);
    ``relative_granularity`` = γ/c. Accounted by RDP only (Proposition 14 with Zhu–Wang's
    amplification), under zero-out neighbouring, and under add/remove too when ``fixed_parties``:
    the ``shares`` come from a set of parties fixed in advance, each user's party a function of
    the user alone, so neither their number nor anyone else's party depends on who is sampled
    (module docstring). One share per *sampled client* (the calculator's model) is zero-out only."""

    noise_multiplier: float = attr.ib()
    shares: int = attr.ib()
    dim: int = attr.ib()
    relative_granularity: float = attr.ib()
    sampling_rate: float = attr.ib()
    rounds: int = attr.ib()
    beta: float = attr.ib(default=BETA)
    fixed_parties: bool = attr.ib(default=False)  # shares from parties fixed in advance (add/remove holds)

    def __repr__(self) -> str:
        return (f"DistributedDiscreteGaussian(noise_multiplier={self.noise_multiplier:g}, shares={self.shares}, "
                f"dim={self.dim}, granularity/clip={self.relative_granularity:g}, q={self.sampling_rate:g}, "
                f"rounds={self.rounds}{', fixed parties' if self.fixed_parties else ''})")

    def mechanism(self) -> DistributedDiscreteGaussian:
        """The round's mechanism at clip 1."""
        share_std = self.noise_multiplier / math.sqrt(self.shares)
        return DistributedDiscreteGaussian(1.0, self.relative_granularity, share_std, self.shares, self.dim, self.beta)

    def repeated(self, count: int) -> "DistributedDiscreteGaussianDpEvent":
        """This event ``count`` times over: the same rounds, ``count`` × as many."""
        return attr.evolve(self, rounds=self.rounds * int(count))

    def epsilon(self, delta: float) -> float:
        """ε at ``delta`` (∞ without noise)."""
        if self.noise_multiplier == 0:
            return math.inf
        return self.mechanism().epsilon(delta, self.rounds, self.sampling_rate)
