"""``backend=local``'s in-process round (fedpriv.round.clients.StreamedReplies): each client's delta is
clipped into the sum as soon as it exists and dropped — the round never holds the cohort's deltas —
and the sum is the one Flower's message path builds from the same clients (bit for bit)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import fedpriv.round.clients as clients
from conftest import compose_cfg
from fedpriv.round.aggregation import RoundAggregate
from fedpriv.runner import prepare
from server.app import grid_round_fn
from server.grid import LocalGrid
from client.app import make_client_app


def _session(tmp_path, name: str):
    cfg = compose_cfg("+experiment=smoke", "progress=false", "rounds=1", "cohort_size=8", run_dir=tmp_path / name)
    return cfg, prepare(cfg)


def test_the_round_holds_one_delta_at_a_time(tmp_path, monkeypatch):
    cfg, session = _session(tmp_path, "r")
    alive: list[weakref.ref] = []
    most = 0
    trained = clients.client_update

    def tracked(*args, **kwargs):
        update = trained(*args, **kwargs)
        alive.append(weakref.ref(update.delta))
        return update

    class Counting(RoundAggregate):
        def add(self, delta, tally=True):
            nonlocal most
            gc.collect()
            most = max(most, sum(ref() is not None for ref in alive))
            return super().add(delta, tally)

    monkeypatch.setattr(clients, "client_update", tracked)
    cohort = session.server.cohort(0)
    inputs = session.server.round_inputs(0, cohort)
    replies = clients.in_process_round_fn(session.task, session.spec)(inputs)
    agg = Counting.zeros(inputs.params.numel(), inputs.clip_norm)
    seen, _ = replies.add_to(agg, {int(u) for u in cohort}, 0)
    session.run.unlock()
    assert len(alive) == len(cohort) >= 4 and seen == {int(u) for u in cohort}
    assert agg.accepted == len(cohort)
    assert most == 1  # the delta being added; every earlier one is gone


def test_the_in_process_sum_equals_the_message_path_bit_for_bit(tmp_path):
    cfg, session = _session(tmp_path, "a")
    cohort = session.server.cohort(0)
    inputs = session.server.round_inputs(0, cohort)
    expected = {int(u) for u in cohort}
    streamed = RoundAggregate.zeros(inputs.params.numel(), inputs.clip_norm)
    clients.in_process_round_fn(session.task, session.spec)(inputs).add_to(streamed, expected, 0)
    messages = RoundAggregate.zeros(inputs.params.numel(), inputs.clip_norm)
    grid_round_fn(LocalGrid(make_client_app(cfg), num_nodes=3), 3, None)(inputs).add_to(messages, expected, 0)
    session.run.unlock()
    assert streamed.accepted == messages.accepted == len(cohort)
    assert torch.equal(streamed.total, messages.total)
    assert streamed.norms == messages.norms  # both added in user order


def test_cohort_parallel_sums_beside_the_deltas_and_equals_the_message_path(tmp_path, monkeypatch):
    """client.parallel > 1: the streamed round clips and sums the chunks' deltas where they were
    computed (an aggregate ``beside`` the host one, merged once; no per-user copy to host memory)
    and gets Flower's message path's sum bit for bit on the CPU; an aggregate that scales or tracks
    squares adds in host memory."""
    cfg = compose_cfg("+experiment=smoke", "progress=false", "rounds=1", "cohort_size=8", "client.parallel=3",
                      "client.parallel_on_cpu=true", run_dir=tmp_path / "p")
    session = prepare(cfg)
    assert session.task.trainer is not None
    cohort = session.server.cohort(0)
    inputs = session.server.round_inputs(0, cohort)
    expected = {int(u) for u in cohort}
    made = []
    beside = RoundAggregate.beside

    def noting(self, device):
        near = beside(self, device)
        made.append(near)
        return near

    monkeypatch.setattr(RoundAggregate, "beside", noting)
    streamed = RoundAggregate.zeros(inputs.params.numel(), inputs.clip_norm)
    seen, _ = clients.in_process_round_fn(session.task, session.spec)(inputs).add_to(streamed, expected, 0)
    messages = RoundAggregate.zeros(inputs.params.numel(), inputs.clip_norm)
    grid_round_fn(LocalGrid(make_client_app(cfg), num_nodes=3), 3, None)(inputs).add_to(messages, expected, 0)
    session.run.unlock()
    assert len(made) == 1 and made[0] is not None and made[0].accepted == len(cohort) == streamed.accepted
    assert seen == expected and streamed.accepted == messages.accepted
    assert torch.equal(streamed.total, messages.total)
    assert streamed.norms == messages.norms
    assert RoundAggregate.zeros(4, 1.0, squares=True).beside(torch.device("cpu")) is None
    assert RoundAggregate.zeros(4, 1.0, scale=torch.ones(4)).beside(torch.device("cpu")) is None


def test_merge_takes_only_an_aggregate_of_the_same_bound():
    host = RoundAggregate.zeros(3, 1.0)
    near = host.beside(torch.device("cpu"))
    near.add(torch.tensor([3.0, 4.0, 0.0]))  # norm 5: clipped to 1
    near.add(torch.tensor([float("nan"), 0.0, 0.0]))  # rejected, counted
    host.merge(near)
    assert torch.allclose(host.total, torch.tensor([0.6, 0.8, 0.0]))
    assert (host.accepted, host.rejected, host.clipped, host.norms) == (1, 1, 1, [5.0])
    with pytest.raises(ValueError, match="beside"):
        host.merge(RoundAggregate.zeros(3, 2.0))
