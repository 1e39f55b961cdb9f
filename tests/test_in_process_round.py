"""``backend=local``'s in-process round (fedpriv.clients.StreamedReplies): each client's delta is
clipped into the sum as soon as it exists and dropped — the round never holds the cohort's deltas —
and the sum is the one Flower's message path builds from the same clients (bit for bit)."""

from __future__ import annotations

import gc
import weakref

import torch

import fedpriv.clients as clients
from conftest import compose_cfg
from fedpriv.aggregation import RoundAggregate
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
