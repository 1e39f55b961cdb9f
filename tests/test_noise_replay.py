"""Correlated noise is rebuilt from the key on resume, never checkpointed (fedpriv/mechanisms/streaming.py).

Pins: (1) every mechanism's state is O(1) in the model's size — no tensor, whatever d, bands or
buffers; (2) a resume after any round continues with bit-identical noise (replay from round 0, or
from the tree's last restart); (3) a replay that does not reproduce the checkpoint's noise (another
key, an edited position, an edited digest, a foreign stream use) is refused; (4) σ = 0 replays
nothing; (5) end to end, a BandMF or BLT run's ``last.pt`` is a Gaussian run's size.
"""

from __future__ import annotations

import io

import pytest
import torch

from fedpriv.errors import ConfigError
from fedpriv.keys.randomness import NoiseStream
from fedpriv.keys.research_key import key_from_seed
from fedpriv.mechanisms.bandmf import BandMFMechanism
from fedpriv.mechanisms.blt import BLTMechanism
from fedpriv.mechanisms.tree import TreeMechanism

ROUNDS = 9


def _build(kind: str, seed: int = 3, sigma: float = 1.5, rounds: int = ROUNDS):
    noise = NoiseStream(key_from_seed(seed))
    if kind.startswith("bandmf"):
        return BandMFMechanism(sigma, 0.5, rounds=rounds, bands=int(kind[len("bandmf"):]), noise=noise)
    if kind == "blt":
        return BLTMechanism(sigma, 0.5, rounds=rounds, buffers=2, iterations=30, noise=noise)
    estimator, _, restart = kind[len("tree-"):].partition("-")
    return TreeMechanism(sigma, 0.5, noise=noise, estimator=estimator, restart_every=int(restart) if restart else None)


KINDS = ["bandmf2", "bandmf4", "blt", "tree-plain", "tree-efficient", "tree-efficient-3"]


def _tensors(state) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for v in state.values() for t in _tensors(v)]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in _tensors(v)]
    return []


@pytest.mark.parametrize("kind", KINDS)
def test_a_resume_after_any_round_continues_the_same_noise(kind):
    shape = (7,)
    reference = _build(kind)
    full = [reference.noise(t, shape) for t in range(ROUNDS)]
    for cut in range(ROUNDS + 1):
        first = _build(kind)
        head = [first.noise(t, shape) for t in range(cut)]
        resumed = _build(kind)
        resumed.load_state_dict(first.state_dict())
        tail = [resumed.noise(t, shape) for t in range(cut, ROUNDS)]
        torch.testing.assert_close(torch.stack(head + tail), torch.stack(full), rtol=0, atol=0)
        assert (resumed.state_dict()["replay"], resumed.state_dict()["noise"]) == (
            reference.state_dict()["replay"], reference.state_dict()["noise"])
        if cut < ROUNDS:  # the rebuilt operator state itself (float64 for BandMF's sums and BLT's buffers)
            again = _build(kind)
            again.load_state_dict(first.state_dict())
            assert _same_state(again.operator, _run(kind, cut).operator)


def _run(kind: str, rounds: int, shape=(7,)):
    mechanism = _build(kind)
    for t in range(rounds):
        mechanism.noise(t, shape)
    return mechanism


def _same_state(a, b) -> bool:
    """Two operators' online state (BandMF's residuals, BLT's buffers, the tree's stack and prefix) bit for bit."""
    def tensors(op):
        if hasattr(op, "_history"):
            return list(op._history) + [torch.tensor(op.t)]
        if hasattr(op, "_buffers"):
            return [] if op._buffers is None else [op._buffers]
        return [v for _, v in op._tree.stack] + ([] if op._previous is None else [op._previous]) + [
            torch.tensor(op._tree.leaves)]
    x, y = tensors(a), tensors(b)
    return len(x) == len(y) and all(u.dtype == v.dtype and torch.equal(u, v) for u, v in zip(x, y))


@pytest.mark.parametrize("kind", KINDS)
def test_the_state_holds_no_noise_whatever_the_model_size(kind):
    sizes = {}
    for d in (5, 5000):
        mechanism = _build(kind)
        for t in range(6):
            mechanism.noise(t, (d,))
        state = mechanism.state_dict()
        sizes[d] = sum(t.numel() for t in _tensors(state))
        assert state["replay"]["shape"] == [d]
    assert sizes[5] == sizes[5000]  # BandMF keeps its strategy (b × T floats), nothing of size d


def test_the_tree_replays_from_its_last_restart_only():
    mechanism = _build("tree-plain-3")
    for t in range(7):
        mechanism.noise(t, (4,))
    assert mechanism.state_dict()["replay"]["round"] == 6  # rounds 0-5 are two finished trees
    assert mechanism.state_dict()["replay"]["draw"] == 2 * (2 * 3 - 2)  # 2L − popcount(L) draws per 3-leaf tree


@pytest.mark.parametrize("kind", ["bandmf2", "blt", "tree-efficient-3"])
def test_a_replay_that_does_not_reproduce_the_noise_is_refused(kind):
    first = _build(kind)
    for t in range(5):
        first.noise(t, (6,))
    state = first.state_dict()
    with pytest.raises(ValueError, match="does not match"):
        _build(kind, seed=4).load_state_dict(state)  # another key
    edited = {**state, "replay": {**state["replay"], "last_sha256": "0" * 64}}
    with pytest.raises(ValueError, match="does not match"):
        _build(kind).load_state_dict(edited)
    edited = {**state, "noise": {"draws": state["noise"]["draws"] + 1}}  # a position the rounds do not explain
    with pytest.raises(ValueError, match="does not match"):
        _build(kind).load_state_dict(edited)
    edited = {**state, "replay": {**state["replay"], "round": 5}}
    with pytest.raises(ValueError, match="outside"):
        _build(kind).load_state_dict(edited)
    edited = {**state, "replay": {**state["replay"], "round": 1}}  # the state is empty only at 0 (and 3 for the tree)
    with pytest.raises(ValueError, match="not empty"):
        _build(kind).load_state_dict(edited)
    edited = {**state, "replay": {**state["replay"], "kernels": {"torch": "2.0.0", "cpu_capability": "DEFAULT"}}}
    with pytest.raises(ConfigError, match="ATEN_CPU_CAPABILITY=default"):
        _build(kind).load_state_dict(edited)
    edited = {**state, "replay": None}
    with pytest.raises(ValueError, match="no replay point"):
        _build(kind).load_state_dict(edited)
    edited = {**state, "replay": {**state["replay"], "shape": [7]}}
    with pytest.raises(ValueError, match="does not match"):
        _build(kind).load_state_dict(edited)


def test_a_replay_that_does_not_match_is_one_error_line_end_to_end(tmp_path):
    """An edited digest in a run's last.pt reaches the user as one DamagedFileError line, other
    kernels as one ConfigError line (its own advice), before anything of the run is touched."""
    from conftest import compose_cfg
    from fedpriv.errors import DamagedFileError
    from fedpriv.runner import prepare
    from server.app import run_local

    overrides = ("+experiment=smoke", "progress=false", "rounds=4", "mechanism=blt", "sampling=cyclic")
    run_local(prepare(compose_cfg(*overrides, run_dir=tmp_path / "r")))
    path = tmp_path / "r" / "checkpoints" / "last.pt"
    original = path.read_bytes()
    resume = {**compose_cfg(*overrides, run_dir=tmp_path / "r"), "resume": True}
    for edit, error, words in (("last_sha256", DamagedFileError, "does not match the checkpoint"),
                               ("kernels", ConfigError, "resume where it was written")):
        state = torch.load(path, weights_only=True)
        replay = state["server"]["mechanism"]["replay"]
        replay[edit] = "0" * 64 if edit == "last_sha256" else {"torch": "2.0.0", "cpu_capability": "AVX2"}
        torch.save(state, path)
        with pytest.raises(error, match=words) as caught:
            prepare(resume)
        assert "\n" not in str(caught.value)
        path.write_bytes(original)


def test_a_draw_of_another_shape_is_refused():
    mechanism = _build("bandmf2")
    mechanism.noise(0, (6,))
    with pytest.raises(ValueError, match="shape"):
        mechanism.noise(1, (7,))


def test_no_noise_no_replay():
    mechanism = _build("bandmf2", sigma=0.0)
    for t in range(4):
        assert torch.count_nonzero(mechanism.noise(t, (6,))) == 0
    state = mechanism.state_dict()
    assert state["replay"] is None and state["noise"]["draws"] == 0
    resumed = _build("bandmf2", sigma=0.0)
    resumed.load_state_dict(state)
    assert resumed.rounds_done == 4 and torch.count_nonzero(resumed.noise(4, (6,))) == 0


def _checkpoint_bytes(run_dir) -> int:
    return (run_dir / "checkpoints" / "last.pt").stat().st_size


def _mechanism_bytes(run_dir) -> int:
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    buffer = io.BytesIO()
    torch.save(state["server"]["mechanism"], buffer)
    return len(buffer.getvalue())


def test_a_correlated_runs_checkpoint_is_a_gaussian_runs_size(tmp_path):
    """End to end (the smoke model): ``last.pt`` of BandMF (2 and 6 bands) and BLT is within a few
    KiB of a Gaussian run's — the stream positions, the replay point and BandMF's b × T strategy —
    while their noise windows alone would be (b − 1)·d·4 and buffers·d·8 bytes."""
    from conftest import compose_cfg
    from fedpriv.runner import prepare
    from server.app import run_local

    base = ("+experiment=smoke", "progress=false", "rounds=6", "cohort_size=5")
    cyclic = "sampling=cyclic"  # 8 rounds between a user's participations: room for 6 bands
    runs = {"gaussian": ("mechanism=gaussian",), "bandmf2": ("mechanism=bandmf", "mechanism.bands=2", cyclic),
            "bandmf6": ("mechanism=bandmf", "mechanism.bands=6", cyclic), "blt": ("mechanism=blt", cyclic)}
    sizes, dims = {}, {}
    for name, extra in runs.items():
        session = prepare(compose_cfg(*base, *extra, run_dir=tmp_path / name))
        run_local(session)
        sizes[name] = _checkpoint_bytes(tmp_path / name)
        dims[name] = session.server.params.numel()
        assert _mechanism_bytes(tmp_path / name) < 8 * 1024 + 8 * 6 * 6  # the b × T strategy at most
    d = dims["gaussian"]
    assert d > 10_000  # the windows would be visible: (6 − 1)·d·4 bytes is > 200 KB
    for name in ("bandmf2", "bandmf6", "blt"):
        assert abs(sizes[name] - sizes["gaussian"]) < 8 * 1024, (name, sizes)


def test_a_checkpoint_of_the_format_that_stored_the_window_is_refused_with_one_line(tmp_path):
    """A format-2 checkpoint (BandMF's window inside) is not resumed as if it were format 3: refused,
    naming both formats and what to do."""
    from conftest import compose_cfg
    from fedpriv.errors import DamagedFileError
    from fedpriv.runner import prepare
    from server.app import run_local

    overrides = ("+experiment=smoke", "progress=false", "rounds=4", "mechanism=bandmf", "mechanism.bands=2",
                 "sampling=cyclic")
    session = prepare(compose_cfg(*overrides, run_dir=tmp_path / "r"))
    run_local(session)
    path = tmp_path / "r" / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=True)
    state["format"] = 2
    state["server"]["mechanism"]["history"] = [torch.zeros(3)]
    torch.save(state, path)
    with pytest.raises(DamagedFileError, match="has format 2, this fedpriv reads format 3 .*start a new run"):
        prepare({**compose_cfg(*overrides, run_dir=tmp_path / "r"), "resume": True})


@pytest.mark.parametrize("kind", ["bandmf4", "blt"])
def test_the_replay_is_bit_identical_under_another_thread_count(kind):
    """Rounds on one thread, resumed on three (a model large enough for torch to split its
    elementwise kernels across threads): the replay passes its digest check and continues the noise."""
    shape, before = (300_001,), torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        full = _build(kind)
        expected = [full.noise(t, shape) for t in range(6)]
        first = _build(kind)
        for t in range(4):
            first.noise(t, shape)
        torch.set_num_threads(3)
        resumed = _build(kind)
        resumed.load_state_dict(first.state_dict())
        tail = [resumed.noise(t, shape) for t in range(4, 6)]
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(expected[4:], tail))
