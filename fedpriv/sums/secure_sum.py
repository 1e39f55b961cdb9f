"""A distributed-DP round in this process: parties encode their users' updates, a secure sum adds
the messages modulo the field, the server decodes what the sum reveals (``backend=local`` with a
``client_noise`` mechanism, :mod:`fedpriv.mechanisms.ddgauss`).

Round t's cohort is dealt to the mechanism's ``shares`` parties by user id (user u to party
u mod n: :func:`fedpriv.sums.assign_parties`, the one user→party rule); each party trains its users
(:func:`fedpriv.round.clients.iter_client_updates`: what the ClientApp computes), rounds each update on
the grid under its own secret key (:meth:`fedpriv.mechanisms.ddgauss_codec.DDGaussCodec.rounded`) and adds
one noise share, holding a user or not (:meth:`~fedpriv.mechanisms.ddgauss_codec.DDGaussCodec.message`).
The secure sum is simulated as what secure aggregation reveals: the messages' sum mod m, nothing
else; the server receives it decoded (:class:`SecureSum`) and the set of users whose updates it
holds, never one update. No cryptography runs here: the masks of SecAgg/SecAgg+ cancel in the
sum, so the server's view is the same; what a deployment needs beyond that is Flower's SecAgg+.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fedpriv.round.aggregation import RoundAggregate
from fedpriv.round.clients import dropped, iter_client_updates
from fedpriv.config.resolve import client_diagnostics_enabled
from fedpriv.mechanisms.ddgauss_codec import DDGaussCodec
from fedpriv.keys.randomness import ClientRandomness
from fedpriv.round.replies import RoundFn, RoundInputs
from fedpriv.keys.research_key import client_randomness
from fedpriv.schema import RunConfig
from fedpriv.sums import assign_parties
from fedpriv.task import Task


@dataclass
class SecureSum:
    """What secure aggregation revealed of a round: the decoded sum ``total`` of the parties'
    messages (clipped updates + rounding + their noise shares, float32), the ``users`` whose
    updates it holds, the number of noise ``shares`` in it, the users who replied with an update
    that could not be encoded (``rejected``: non-finite; counted, never summed) and the clients'
    training losses (diagnostics only)."""

    total: torch.Tensor
    users: set[int]
    shares: int
    rejected: set[int] = field(default_factory=set)
    losses: list[float] = field(default_factory=list)
    round_idx: int | None = None  # the round it sums (checked when it is added)

    def add_to(self, agg: RoundAggregate, expected: set[int], round_idx: int) -> tuple[set[int], list[float]]:
        if self.round_idx is not None and self.round_idx != round_idx:
            raise ValueError(f"the secure sum of round {self.round_idx + 1} added to round {round_idx + 1}")
        if not (self.users | self.rejected) <= expected:
            raise ValueError("a secure sum holds updates of users outside the round's cohort")
        agg.add_secure_sum(self.total, len(self.users), self.shares)
        agg.rejected += len(self.rejected)
        return self.users | self.rejected, self.losses


@dataclass
class PartyMessage:
    """One party's round: its ``message`` in Z_m (int64), the users whose updates it holds, those
    whose update could not be encoded, and their training losses (diagnostics only)."""

    message: torch.Tensor
    users: set[int]
    rejected: set[int]
    losses: list[float]


def party_message(codec: DDGaussCodec, task: Task, params: torch.Tensor, members: list[int], round_idx: int,
                  round_key: bytes, rng: ClientRandomness, party: int, diagnostics: bool = False) -> PartyMessage:
    """What party ``party`` sends in round ``round_idx``: its ``members``' updates (trained from
    ``params`` with their draws from ``rng``), each rounded on the grid under the party's secret
    key (:meth:`~fedpriv.keys.randomness.ClientRandomness.party_key`), summed, plus its one noise share,
    mod m. The in-process round and a Flower node under ``aggregation=secagg`` both call it."""
    key = rng.party_key(round_idx, party)
    rounded = torch.zeros(codec.mechanism.dim, dtype=torch.int64)
    users: set[int] = set()
    rejected: set[int] = set()
    losses: list[float] = []
    for update in (iter_client_updates(task, params, members, round_idx, rng, diagnostics) if members else ()):
        if "train_loss" in update.metrics:
            losses.append(update.metrics["train_loss"])
        try:
            rounded += codec.rounded(update.delta, round_key, round_idx, key, update.user)
        except FloatingPointError:  # a non-finite update: left out of the party's sum, counted
            rejected.add(update.user)
            continue
        users.add(update.user)
    return PartyMessage(codec.message(rounded, round_idx, key, party), users, rejected, losses)


def distributed_round_fn(task: Task, spec: RunConfig, mechanism, round_key: bytes,
                         dropout_key: bytes | None = None) -> RoundFn:
    """``backend=local``'s round for a ``client_noise`` ``mechanism`` (module docstring): the
    parties' keys and the users' draws are the ClientApp's for ``spec``
    (:func:`~fedpriv.keys.research_key.client_randomness`); ``round_key`` keys the rotation's signs
    (public randomness: privacy does not rest on it). With ``client.dropout_rate`` each party fails
    with that probability (:func:`~fedpriv.round.clients.dropped`): its users count as dropped and its
    share is missing from the sum, which then holds fewer shares (withheld below ``min_shares``)."""
    rng, diagnostics = client_randomness(spec), client_diagnostics_enabled(spec)
    codec = mechanism.codec()
    length = task.initial_params.numel()

    def round_fn(inputs: RoundInputs) -> SecureSum:
        if not math.isclose(inputs.clip_norm, mechanism.clip_norm):
            raise ValueError(f"the round's clip {inputs.clip_norm} is not the mechanism's {mechanism.clip_norm}")
        r = inputs.round_idx
        total = torch.zeros(codec.mechanism.dim, dtype=torch.int64)
        seen: set[int] = set()
        rejected: set[int] = set()
        losses: list[float] = []
        lost = dropped(dropout_key, r, range(mechanism.shares), spec.client.dropout_rate, "party")
        parties = assign_parties([int(u) for u in inputs.cohort], mechanism.shares)
        for party, members in enumerate(parties):
            if lost[party]:  # its message never reaches the sum: neither its users nor its share
                continue
            sent = party_message(codec, task, inputs.params, members, r, round_key, rng, party, diagnostics)
            seen |= sent.users
            rejected |= sent.rejected
            losses += sent.losses
            total = torch.remainder(total + sent.message, codec.modulus)
        decoded = codec.decode(total, round_key, r, length).to(torch.float32)
        return SecureSum(decoded, seen, int((~lost).sum()), rejected, losses, round_idx=r)

    return round_fn
