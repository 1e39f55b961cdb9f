"""The forward replay of Book-Keeping (:mod:`fedpriv.clipping.engine`): the proof that the model does not mix
samples in its forward (:mod:`fedpriv.clipping.provenance`, item 4), and the independence check of the inputs
of shared calls made inside the model (item 2).

The engine owns the hooks and the clipping; it hands this module's :class:`ForwardReplay` what each hook sees,
through a small interface:

- where the model's forward starts and ends (:meth:`ForwardReplay.begin`, :meth:`ForwardReplay.end`), before
  each hooked call (:meth:`ForwardReplay.before_call`) and after it (:meth:`ForwardReplay.record`), and each
  :func:`~fedpriv.clipping.provenance.flat_positions` (:meth:`ForwardReplay.flattened`, as a listener);
- while a replay runs (:attr:`ForwardReplay.running`) every hooked call goes to :meth:`ForwardReplay.on_call`;
- at a backward: :meth:`ForwardReplay.take` (this step's forwards, and the step counted for the schedule),
  :meth:`ForwardReplay.check_independent` and :meth:`ForwardReplay.run` (refusing a model with
  :class:`~fedpriv.clipping.provenance.UnsupportedLayerError`) before any ``p.grad`` is written.

A replay runs the step's forward again with a random half of the samples perturbed (torch's RNG streams restored
to where the forward started, so dropout draws the same masks) and fails if any hooked call's rows of the other
samples, or the model's return value's, changed at all. Which samples, and how, are drawn from keyed streams
under a key derived from the engine's key with the label ``bk-perturbed-replays``
(:class:`~fedpriv.clipping.provenance.KeyedDraws`, each replay its own index), never a seeded generator a model
could predict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor, nn
from torch.nn.modules import module as torch_module
from torch.profiler import record_function
from torch.utils.hooks import RemovableHandle

from fedpriv.clipping.provenance import (CallPrint, KeyedDraws, UnsupportedLayerError, call_print,
                                         check_data_independent, declared_rows, expand_rows, map_tensors,
                                         output_mismatch, output_prints, perturb_samples, perturbed, replay_error,
                                         replay_mismatch, rows_within, same_state, same_values, state_print,
                                         value_print)
from fedpriv.clipping.rules import FORWARDS, RULES
from fedpriv.keys.keystream import GaussianKeystream
from fedpriv.keys.randomness import KEY_BYTES, keystream

REPLAY_FIRST = 4  # the forward replay runs on an engine's first steps ...
REPLAY_EVERY = 8  # ... and on every REPLAY_EVERY-th after (``replay_every``; 1: every step)
_MODULE_CALL = {name: getattr(nn.Module, name) for name in ("__call__", "_wrapped_call_impl", "_call_impl")}


@dataclass
class _LastCall:
    """The last hooked call of a forward to replay, while it runs: its output, whether the replay may end before
    it (a registered layer's own call on batch rows) and, where it is the call predicted last and only its
    registered forward ran, the value_print of its output when it returned and its module's state_print."""

    output: Tensor
    may_end: bool
    proof: Optional[tuple[tuple[Tensor, Optional[Tensor]], list]] = None


@dataclass
class _Forward:
    """One forward of the model to replay (:meth:`ForwardReplay.run`): its arguments, the
    RNG states it started from, the batch, and what each hooked call of it computed, in order."""

    args: tuple
    kwargs: dict
    rng: tuple[Tensor, list[tuple[int, Tensor]]]  # torch's CPU state, (device, state) per CUDA device
    batch: int
    prints: list[tuple[CallPrint, Optional[str]]]  # with the expansion the engine applied ("shared", "broadcast")
    shapes: tuple = ()  # the shapes of the tensors in its arguments (each new one is replayed: _signature)
    # the model's return value as compared (output_prints); None where ``state`` is set (or the model's forward
    # hook never ran: refused)
    output: Optional[list[CallPrint]] = None
    # where the model returned its last call's output with the values that call computed, and only that
    # registered layer's own forward ran in the call: the state_print of its module at the call (the replay then
    # ends before that call, comparing its input and this: :meth:`ForwardReplay._replay_last`)
    state: Optional[list] = None
    # while the forward runs: torch's hook count when it started; whether the call predicted last may still be
    # proven to run only its registered forward (:meth:`ForwardReplay._only_own_code`); the last hooked call; the
    # samples of the rows of each flat_positions it made (dropped when it returns)
    hooks: int = 0
    clean: bool = False
    last: Optional[_LastCall] = None
    flat: list[Tensor] = field(default_factory=list)


@dataclass
class _Replaying:
    """The state of one replay: the forward replayed, the perturbed samples, the next call, the
    outputs of its calls on flattened positions (with their rows' samples), and the first
    mismatch found (kept here too, so a model that catches :class:`_ReplayMismatch` cannot hide it)."""

    forward: _Forward
    chosen: Tensor
    next: int = 0
    flat: list[Tensor] = field(default_factory=list)
    mismatch: Optional[tuple[str, nn.Module, str]] = None
    ended: bool = False  # the engine ended it (_replay_last): a _ReplayDone it did not raise is the model's own


class _ReplayMismatch(BaseException):
    """Ends a replay at the first call that differs (turned into an UnsupportedLayerError). A
    ``BaseException``, so that a model's ``except Exception`` does not swallow it."""


class _ReplayDone(BaseException):
    """Ends a replay before its last call when that call's output is the model's return value,
    unchanged, of a registered layer that ran only its own forward, and its input and module state were
    compared (the output layer of a language model, its largest product, is not computed again). Trusted
    only where the engine raised it (``_Replaying.ended``); the model raising it is refused."""


def first_tensor(args: tuple, kwargs: dict) -> Optional[Tensor]:
    """The first tensor among a call's positional, then keyword, arguments (its batch-first input)."""
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, Tensor):
            return value
    return None


def _signature(args: tuple, kwargs: dict) -> tuple:
    """The shapes of every tensor in a forward's arguments (in their tuples, lists and dicts too),
    by position and keyword: a forward whose signature no replay has seen is replayed."""
    shapes: list = []
    for key, value in list(enumerate(args)) + list(kwargs.items()):
        map_tensors(value, lambda t, key=key: shapes.append((key, tuple(t.shape))))
    return tuple(shapes)


def _drop_saved(tensor: Tensor) -> None:
    """The forward replay's autograd saves nothing (its graph is never differentiated): each of its
    activations is freed when the forward no longer needs it, as without grad."""
    return None


def _no_saved(_: None) -> Tensor:
    raise RuntimeError("the forward replay keeps no tensor for a backward: a forward that differentiates "
                       "inside itself cannot be replayed")


class ForwardReplay:
    """The forward replay of one :class:`~fedpriv.clipping.engine.BookKeeping` engine: what the forwards to replay
    computed, the replay's schedule and its keyed draws.

    ``model``: the hooked model; ``key``: the engine's 32-byte key (its noise key), from which the draws' key is
    derived under the label ``bk-perturbed-replays``; ``replay_every``: the schedule (the first ``REPLAY_FIRST``
    steps and every ``replay_every``-th after); ``by_path``: the hooked modules by path (refusals name them);
    ``own``: the ids of the engine's hook handles (any other hook is foreign code, :meth:`_only_own_code`).
    """

    def __init__(self, model: nn.Module, key: bytes, replay_every: int, by_path: dict[str, nn.Module],
                 own: set[int]) -> None:
        self.model = model
        self.replay_every = replay_every
        self._by_path = by_path
        self._own = own
        # the perturbed replays' key (KeyedDraws): another function of the engine's key (SHAKE-256 under a label of
        # its own, where the noise is ChaCha20 under the key), so a research key reproduces the replays
        self._draws_key = keystream(key, "bk-perturbed-replays", (), KEY_BYTES)
        self._draws_made = 0  # KeyedDraws made so far: each replay's index
        self._independent: set[str] = set()  # paths whose shared inputs the replay proved sample-free
        self._replayed: Optional[dict[str, list[Tensor]]] = None  # inputs recorded during a replay
        self.steps = 0  # backwards run (the forward replay's schedule)
        self._forwards: list[_Forward] = []  # this step's forwards, for the forward replay
        self._in_forward = False  # inside a forward of the model (hooked calls outside cannot be replayed)
        self._outside: Optional[str] = None  # a hooked call made outside the model's forward
        self._replaying: Optional[_Replaying] = None
        self._open: Optional[_Forward] = None  # the recorded forward now running (its return value is kept)
        self._replayed_shapes: set[tuple] = set()  # the _signature of every forward replayed so far
        self._last_call: Optional[tuple[int, str]] = None  # (index, path) of the call whose output the last
        # recorded forward returned: its output's values are printed when it returns (value_print)
        self._directions: dict[tuple, Tensor] = {}  # value_print's secret directions, by (length, dtype, device)
        self._check_stream = GaussianKeystream()  # their source (a key of its own: the noise stream is untouched)

    # ------------------------------------------------------------------ schedule and state

    @property
    def due(self) -> bool:
        """Whether the next step's forward is replayed by the schedule (:meth:`run`): the
        first ``REPLAY_FIRST`` steps of this engine and every ``replay_every``-th step (counted from 0).
        A forward whose arguments' shapes no replay has seen yet is replayed too (a model that mixes only
        at some batch size, the last short batch of an epoch, say, cannot wait for the schedule)."""
        return self.steps < REPLAY_FIRST or self.steps % self.replay_every == 0

    @property
    def pending(self) -> bool:
        """Whether the forward(s) run since the last backward will be replayed by the next one."""
        return bool(self._forwards)

    @property
    def running(self) -> bool:
        """Whether a replay (the forward replay, or the independence check's) is running the model now."""
        return self._replaying is not None or self._replayed is not None

    def clear(self) -> None:
        """Drop the forwards recorded since the last backward."""
        self._forwards = []
        self._outside = None

    def take(self) -> tuple[list[_Forward], Optional[str]]:
        """At a backward: this step's forwards to replay and the first hooked call made outside the model's forward
        (both dropped here), the step counted for the schedule."""
        pending = self._forwards, self._outside
        self.steps += 1
        self.clear()
        return pending

    def _draws(self, label: str) -> KeyedDraws:
        """The next replay's random choices: keyed by the engine's key (:class:`KeyedDraws`), never a
        seeded generator a model could predict; indexed by a count, so no two replays share draws."""
        self._draws_made += 1
        return KeyedDraws(self._draws_key, label, self._draws_made)

    def direction(self, t: Tensor) -> Optional[Tensor]:
        """:func:`~fedpriv.clipping.provenance.value_print`'s secret direction for ``t`` (None: not float)."""
        if not t.is_floating_point() or not t.dim():
            return None
        wide = torch.promote_types(t.dtype, torch.float32)  # value_print projects in float32 at least
        key = (t.shape[-1], wide, t.device)
        if key not in self._directions:
            self._directions[key] = self._check_stream.normal((t.shape[-1],)).to(wide).to(t.device)
        return self._directions[key]

    # ------------------------------------------------------------------ the independence check

    def check_independent(self, made: list[tuple[str, Tensor]], call_args: Optional[tuple[tuple, dict]]) -> None:
        """Replay the model's forward on perturbed arguments (no autograd, the RNG streams
        restored afterwards) and fail if a shared input made in the forward changed
        (:func:`~fedpriv.clipping.provenance.check_data_independent`). Once per call path (the
        model's structure is assumed not to change between backwards, as for separability)."""
        unchecked = [(path, x) for path, x in made if path not in self._independent]
        if not unchecked or call_args is None:
            return
        with record_function("bk.independence_check"):
            args, kwargs = call_args
            draws = self._draws("bk-independence-check")
            args2 = tuple(perturbed(a, draws) for a in args)
            kwargs2 = {k: perturbed(v, draws) for k, v in kwargs.items()}
            devices = [d.index for d in {p.device for p in self.model.parameters()} if d.type == "cuda"]
            self._replayed = {}
            try:
                with torch.random.fork_rng(devices=devices), torch.no_grad():
                    self.model(*args2, **kwargs2)
                replayed = self._replayed
            finally:
                self._replayed = None
            check_data_independent(unchecked, replayed, self._by_path)
            self._independent.update(path for path, _ in unchecked)

    # ------------------------------------------------------------------ the recorded forward

    def begin(self, args: tuple, kwargs: dict, x: Tensor) -> None:
        """The model's forward starts with grad enabled on batch input ``x``: kept to be replayed (its arguments and
        RNG states) where the schedule says so or its arguments' shapes are new, and a batch has more than one
        sample (nothing to compare in one)."""
        self._in_forward = True
        shapes = _signature(args, kwargs)
        if x.shape[0] > 1 and (self.due or shapes not in self._replayed_shapes):
            # the forward replay's starting point: arguments, RNG states
            devices = sorted({p.device.index or 0 for p in self.model.parameters() if p.device.type == "cuda"})
            rng = (torch.get_rng_state(), [(d, torch.cuda.get_rng_state(d)) for d in devices])
            predicted = self._by_path.get(self._last_call[1]) if self._last_call else None
            self._forwards.append(_Forward(args, dict(kwargs), rng, x.shape[0], [], shapes,
                                           hooks=RemovableHandle.next_id,
                                           clean=predicted is not None and self._only_own_code(predicted)))
            self._open = self._forwards[-1]

    def end(self, output: Any) -> None:
        """The model's forward has returned (or raised): a recorded forward to replay keeps what the
        replay compares of its return value (:func:`~fedpriv.clipping.provenance.output_prints`),
        unless that is the last hooked call's output (or a view within its rows,
        :func:`~fedpriv.clipping.provenance.rows_within`) holding, by value, what that call computed
        (:func:`~fedpriv.clipping.provenance.value_print` when the call returned and now, so a write
        through ``.data`` or numpy, which no version counter sees, is seen), and that call ran only its
        registered layer's forward (:meth:`_only_own_code`): the replay then ends before that call,
        comparing its input and its module's state (:meth:`_replay_last`). Which call that is, is learnt
        from the previous recorded forward (the first is replayed whole)."""
        self._in_forward = False
        forward, self._open = self._open, None
        if forward is None:
            return
        last, flat = forward.last, forward.flat
        forward.last, forward.flat = None, []
        if last is not None and last.may_end and rows_within(output, last.output):
            self._last_call = (len(forward.prints) - 1, forward.prints[-1][0].path)
            now = None if last.proof is None else value_print(last.output, self.direction(last.output))
            if now is not None and same_values(last.proof[0], now):
                forward.state = last.proof[1]
                return
        forward.output = output_prints(output, forward.batch, flat)

    def before_call(self, path: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """A hooked call's pre-hook: in a replay, the call that may end it (:meth:`_replay_last`); in a recorded
        forward, the call predicted last checked for running only its registered forward (:meth:`_only_own_code`)."""
        # (a no-grad call is not recorded; a plain step, neither replayed nor recorded for a replay: nothing)
        if self._replaying is not None:
            if torch.is_grad_enabled():
                self._replay_last(path, module, first_tensor(args, kwargs))
        elif (forward := self._open) is not None and forward.clean and torch.is_grad_enabled() \
                and self._last_call == (len(forward.prints), path):  # the call predicted last
            forward.clean = self._only_own_code(module, first_tensor(args, kwargs))

    def _only_own_code(self, module: nn.Module, x: Optional[Tensor] = None) -> bool:
        """Whether a call of ``module`` made now runs nothing between the engine's pre-hook and hook but its
        registered type's forward (``FORWARDS``): no forward hook or pre-hook but the engine's, no global module
        hook, no torch function or dispatch mode, nothing of torch's call path (``forward``, ``__call__``,
        ``_call_impl``, a compiled call) replaced on the instance or the class, and plain tensors (no subclass's
        ``__torch_function__``) as its input ``x``, parameters and buffers. Checked where the forward starts and
        at the call's pre-hook and hook, with no hook registered in between (torch's hook count), so that no hook
        registered earlier can have hidden another (torch runs the hooks a call started with)."""
        kind = type(module)
        if (torch_module._global_forward_pre_hooks or torch_module._global_forward_hooks
                or not self._own.issuperset(module._forward_pre_hooks)
                or not self._own.issuperset(module._forward_hooks)
                or torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack()
                or kind.forward is not FORWARDS.get(kind) or "forward" in vars(module)
                or getattr(module, "_compiled_call_impl", None) is not None
                or any(name in vars(module) or getattr(kind, name) is not fn for name, fn in _MODULE_CALL.items())):
            return False
        tensors = [t for t in (*module._parameters.values(), *module._buffers.values(), x) if t is not None]
        return all(type(t) in (Tensor, nn.Parameter) for t in tensors)

    def record(self, path: str, module: nn.Module, kind: str, x: Tensor, output: Tensor, recorded: bool,
               rows: Optional[Tensor] = None, expand: Optional[str] = None) -> None:
        """Keep what the forward replay compares of this call (its input's rows; its output's too
        unless the module is of a registered type, whose own forward computes row i from input row i
        only; a call reported by :func:`~fedpriv.clipping.engine.record_call` formed its output elsewhere:
        compared)."""
        if not self._forwards:
            return  # a batch of one: nothing to replay
        if not self._in_forward:
            self._outside = self._outside or f"{path} ({type(module).__name__})"
            return
        trusted = type(module) in RULES and not recorded
        forward = self._forwards[-1]
        forward.prints.append((call_print(path, kind, x, None if trusted else output, rows), expand))
        may_end = trusted and expand is None
        forward.last = _LastCall(output, may_end)
        if (may_end and forward.clean and self._last_call == (len(forward.prints) - 1, path)
                and RemovableHandle.next_id == forward.hooks and self._only_own_code(module, x)):
            # the call predicted last, and nothing but its registered forward ran since the forward started
            forward.last.proof = (value_print(output, self.direction(output)), state_print(module, self.direction))

    def flattened(self, rows: Tensor) -> None:
        """:func:`~fedpriv.clipping.provenance.flat_positions` made rows of samples ``rows``: kept
        while a recorded forward to replay, or its replay, runs (:meth:`end`)."""
        if self._replaying is not None:
            self._replaying.flat.append(rows)
        elif self._open is not None:
            self._open.flat.append(rows)

    # ------------------------------------------------------------------ the replay

    def on_call(self, path: str, module: nn.Module, args: tuple, kwargs: dict, output: Any,
                recorded: bool) -> Optional[Tensor]:
        """A hooked call while a replay runs (:attr:`running`): in the forward replay compared with the original
        forward's (:meth:`_replay_call`); in the independence check's replay its input recorded. Returns the
        output the call returns in its place, if any."""
        if self._replaying is not None:  # the forward replay: compare with the original forward
            if not isinstance(output, Tensor) or not output.requires_grad:
                return None
            return self._replay_call(path, module, first_tensor(args, kwargs), output, recorded)
        x = first_tensor(args, kwargs)  # the replay of check_data_independent: record inputs only
        if x is not None and self._replayed is not None:
            self._replayed.setdefault(path, []).append(x.detach().clone())
        return None

    def _replay_call(self, path: str, module: nn.Module, x: Tensor, output: Tensor,
                     recorded: bool) -> Optional[Tensor]:
        """A hooked call of the replay: compared with the same call of the original forward (the
        engine's expansion of a shared call applied again, so the forward runs as it did)."""
        state = self._replaying
        if state.mismatch is not None:  # a mismatch the model caught: end the replay again
            raise _ReplayMismatch()
        prints = state.forward.prints
        if state.next >= len(prints) or prints[state.next][0].path != path:
            self._mismatch(path, module, "the sequence of layer calls changed")
        original, expand = prints[state.next]
        trusted = type(module) in RULES and not recorded
        if trusted and state.forward.state is not None and state.next == len(prints) - 1:
            self._replay_last(path, module, x)  # its pre-hook did not end the replay (removed?): end it here
        state.next += 1
        rows = declared_rows(x)
        again = call_print(path, original.kind, x, None if trusted else output, rows, copy=False)
        if (original.output is None) != (again.output is None):
            self._mismatch(path, module, "the way this layer was called changed")
        problem = replay_mismatch(original, again, state.chosen)
        if problem:
            self._mismatch(path, module, problem)
        if expand is None:
            return None
        return expand_rows(x, output, state.forward.batch, new_dim=expand == "shared")[1]

    def _mismatch(self, path: str, module: nn.Module, what: str) -> None:
        """Record the replay's first mismatch on its state and end the replay."""
        state = self._replaying
        if state.mismatch is None:
            state.mismatch = (path, module, what)
        raise _ReplayMismatch()

    def _replay_last(self, path: str, module: nn.Module, x: Optional[Tensor]) -> None:
        """Before the replay's last call: if the original forward returned that call's output with
        the values the call computed, and only the registered layer's own forward ran in that call
        (:meth:`end`: it computed row i of its output from input row i and its module's state
        alone), compare that input's kept rows and the module's state (parameters, buffers, attributes:
        :func:`~fedpriv.clipping.provenance.state_print`, so a weight shifted by a batch statistic for the
        call is seen) now, and end the replay without computing the output."""
        state = self._replaying
        if state.mismatch is not None:  # a mismatch the model caught: end the replay again
            raise _ReplayMismatch()
        prints = state.forward.prints
        last = prints[-1][0] if prints else None
        if (x is None or state.forward.state is None or state.next != len(prints) - 1 or last.path != path
                or last.output is not None):
            return
        original = last
        problem = replay_mismatch(original, call_print(path, original.kind, x, None, declared_rows(x)), state.chosen)
        if problem:
            self._mismatch(path, module, problem)
        if not same_state(state.forward.state, state_print(module, self.direction)):
            self._mismatch(path, module, "its parameters, buffers or attributes at this call differ from the forward's")
        state.next += 1
        state.ended = True
        raise _ReplayDone()

    def run(self, forwards: list[_Forward], outside: Optional[str]) -> None:
        """Run each forward of this step again with some samples perturbed (torch's RNG streams
        restored to where the forward started, so dropout draws the same masks; restored again
        afterwards) and fail if any hooked call's rows of the other samples changed at all, or its
        shared input or output did (:func:`~fedpriv.clipping.provenance.replay_mismatch`). Grad is
        enabled, as in the forward, but autograd saves nothing (:func:`_drop_saved`): the replay's
        activations are freed as the forward goes, not held for a backward that never comes (a
        forward that differentiates inside itself fails here, and is refused). A forward replayed
        without a mismatch marks its arguments' shapes as seen."""
        if not forwards:
            return
        if outside is not None:
            raise UnsupportedLayerError(
                f"{outside} was called outside the model's forward, which the forward replay (the proof that no "
                "row mixes samples) cannot run again; call it inside the model's forward")
        for forward in forwards:
            draws = self._draws("bk-forward-replay")
            chosen = draws.chosen(forward.batch)
            args = tuple(perturb_samples(a, chosen, draws) for a in forward.args)
            kwargs = {k: perturb_samples(v, chosen, draws) for k, v in forward.kwargs.items()}
            cpu, cuda = forward.rng
            state = self._replaying = _Replaying(forward, chosen)
            output = None
            try:  # grad enabled as in the forward, its graph never differentiated: nothing saved (_drop_saved)
                with torch.random.fork_rng(devices=[d for d, _ in cuda]), torch.enable_grad(), \
                        torch.autograd.graph.saved_tensors_hooks(_drop_saved, _no_saved):
                    torch.set_rng_state(cpu)
                    for device, rng in cuda:
                        torch.cuda.set_rng_state(rng, device)
                    output = self.model(*args, **kwargs)
            except (_ReplayDone, _ReplayMismatch, Exception) as err:  # noqa: BLE001 - whatever the model raised
                # the engine's own ends are on the state: any other (the model raising the engine's exceptions
                # itself, to end the replay early) is the model's forward raising, and refused
                if state.mismatch is None and not (state.ended and isinstance(err, _ReplayDone)):
                    raise UnsupportedLayerError(
                        f"the model's forward raised {type(err).__name__} ({err}) in the forward replay (the proof "
                        "that no row mixes samples: the same forward with some samples' inputs perturbed); a forward "
                        "must run on any valid input of the same shapes") from err
            finally:
                self._replaying = None
            if state.mismatch is not None:  # (also where the model caught the exception that ended the replay)
                raise replay_error(*state.mismatch[:2], chosen, state.mismatch[2])
            if forward.state is None:  # the return value compared (the replay ends early only where state is set)
                if not forward.output:
                    raise UnsupportedLayerError(
                        "the model's output: " + ("no tensor was found in what the model's forward returned (a tensor, "
                                                  "or tensors in tuples, lists, mappings or dataclasses)"
                                                  if forward.output is not None else "the engine's hook did not see it")
                        + ", so the forward replay cannot compare what the loss is computed from; return those "
                        "tensors so")
                problem = output_mismatch(forward.output, output_prints(output, forward.batch, state.flat, copy=False),
                                          chosen)
                if problem:
                    raise replay_error("the model's output", self.model, chosen, problem)
            done = state.next
            if done != len(forward.prints):
                path = forward.prints[done][0].path
                raise replay_error(path, self._by_path[path], chosen, "the sequence of layer calls changed")
            if forward.state is not None and not state.ended:
                path = forward.prints[-1][0].path
                raise replay_error(path, self._by_path[path], chosen, "the replay did not end before this last call")
            self._replayed_shapes.add(forward.shapes)
