"""Book-Keeping (BK) per-sample clipping: Bu et al., "Differentially Private Optimization on
Large Model at Small Cost" (ICML 2023), for any model built from the layers in
:mod:`fedpriv.clipping.rules`.

One step, given the per-sample losses ``ℓ_i`` of a batch-first forward:

1. Forward hooks keep every supported module call's input ``a`` (detached) and output ``y``.
2. *Ghost differentiation*: ``torch.autograd.grad(Σ_i ℓ_i, [y of every call])`` — one backward
   that computes only the output gradients ``g = ∂L/∂y`` (autograd skips every weight gradient,
   since no parameter is among its inputs). Every call is asked for, so no layer can be dropped
   because of the order of the forward.
3. Each call's ``(a, g)`` becomes per-sample contributions per parameter; several calls of one
   module (LSTM's ``hh`` at every step, any reused layer) and modules sharing a weight (a tied
   embedding and head) are summed per sample, with their cross terms.
4. Per-sample squared norms, per parameter: the ghost norm ``Σ_{t,s} (a_t·a_s)(g_t·g_s)`` or the
   instantiated per-sample gradient, by ``mode``; ``mixopt`` takes ghost iff ``2T² < numel``
   (T = positions per clipping unit over all calls of that parameter, numel = p·d). With
   ``groups``, units of equal size are handled as one batch (their samples' positions end to
   end, no padding to the largest unit) and the rule is applied per such bucket.
5. ``c_i = C / max(||g_i||, C)`` (exact: 1 when ``||g_i|| <= C``, no epsilon; ``||c_i g_i|| <= C``).
6. ``p.grad = Σ_i c_i G_i + σ·C·N(0, I)`` formed from the kept factors (book-keeping), e.g.
   ``Σ_i c_i Σ_t g_{i,t} a_{i,t}ᵀ`` for a Linear weight. ``p.grad`` is *set*, never accumulated.
   The noise is read from a secret ChaCha20 keystream on every core
   (:class:`fedpriv.keys.keystream.GaussianKeystream`).

Which inputs are per sample is *proven*, never guessed from a shape, that no sample's loss
depends on another sample's rows, and (by a forward replay with some samples perturbed, on a
schedule: ``replay_every``, and at each new shape of the arguments) that no row of a hooked call,
nor of the model's return value, depends on another sample, by
:mod:`fedpriv.clipping.provenance` (its docstring states what is proven and under which
assumptions; the replay itself is :mod:`fedpriv.clipping.replay`). A shared call's output is
returned with a new leading batch dim (an ``expand`` view), so each sample gets its own part of the
gradient.

Assumptions: dim 0 of the model input is the batch; sample i's loss depends only on sample i (no
BatchNorm, no mixing of samples); the model does not modify its float inputs, nor a hooked call's
input, in place. (A hooked call's *output* may be: the gradient is taken at the call's own node.)
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.autograd.graph import get_gradient_edge
from torch.profiler import record_function

from fedpriv.clipping.contributions import (Contribution, Dense, Grouping, Outer, Rows, concat,
                                            bucket_view, cross, per_sample, weighted_sum)
from fedpriv.keys.keystream import GaussianKeystream, stream_key
from fedpriv.precision import as_fp32, exact_fp32
from fedpriv.clipping.provenance import (FLAT_LISTENERS, Provenance, UnsupportedLayerError, ambiguous_batch_dim,
                                         check_separable, separability_probe)
from fedpriv.clipping.replay import REPLAY_EVERY, ForwardReplay, first_tensor
from fedpriv.clipping.rules import HINTS, RULES, LayerRule
from fedpriv.clipping.subclass_rules import subclass_rule

MODES = ("ghost", "instantiate", "mixopt")
_INSTANTIATE_BUDGET = 1 << 24  # floats of per-unit gradients held at once on the grouped path
_KEEP_BUDGET = 1 << 25  # elements of per-unit gradients kept for the clipped sums (128 MB in float32)


def _type_name(kind: type) -> str:
    """``nn.Linear`` for torch.nn's own layers, else the full dotted name of the class."""
    if getattr(nn, kind.__name__, None) is kind:
        return f"nn.{kind.__name__}"
    return f"{kind.__module__}.{kind.__qualname__}"


def _hint(module: nn.Module) -> str:
    """Advice for a module without a rule: the registered hint of the nearest class in its MRO,
    else the list of types registered now."""
    for kind in type(module).__mro__:
        if kind in HINTS:
            return HINTS[kind]
    supported = ", ".join(_type_name(kind) for kind in RULES)
    return (f"supported layers are {supported}; move the parameter into one of them, or add a "
            "rule with fedpriv.clipping.register_rule")


@dataclass
class _Call:
    """One recorded module call: batch-first input (detached) and the autograd edge of its output.

    Only the edge is kept, not the output tensor (a language model's logits are the largest
    activation, and nothing else needs them after the loss), so the gradient is taken at the
    layer's own output node: later in-place changes of the output cannot alter it."""

    path: str
    module: nn.Module
    rule: LayerRule
    input: Tensor
    edge: Any  # torch.autograd.graph.GradientEdge of the output
    input_node: Any  # grad_fn of the original input (graph audit continues from here)
    input_leaf: Optional[Tensor]  # the original input if it is a leaf that requires grad
    rows: Optional[Tensor] = None  # a call on flattened positions: the sample of each input row




_RECORDERS: "weakref.WeakKeyDictionary[nn.Module, Callable[..., Any]]" = weakref.WeakKeyDictionary()


def record_call(module: nn.Module, input: Tensor, output: Tensor) -> Optional[Tensor]:
    """Report ``output = module(input)`` computed by a composite module without calling
    ``module`` (e.g. an LSTM's recurrent gate products, formed inside its recurrence), so that an
    attached engine clips ``module``'s parameters from this call as from a real one. ``output``
    must carry autograd's gradient of the loss w.r.t. those products. Returns the tensor to use
    in place of ``output`` (the engine may give a shared call a batch dim), or ``None`` if no
    engine hooks ``module`` — then the caller must make the real call, so that plain autograd
    still reaches the parameters."""
    hook = _RECORDERS.get(module)
    if hook is None:
        return None
    replaced = hook(module, (input,), {}, output, recorded=True)
    return output if replaced is None else replaced



def validate(model: nn.Module) -> list[str]:
    """Every problem that makes :class:`BookKeeping` refuse ``model`` at construction, one message each
    (``path (Class): what``, in the order of ``model.named_modules()``); ``[]`` for a model it accepts. As
    Opacus's ``ModuleValidator.validate``: nothing is raised and nothing changed. A refusal at construction
    names them all, joined by "; ". What only a step can show (a weight used outside its module's call, a
    model that mixes samples in its forward) is refused by :meth:`BookKeeping.backward`."""
    return _survey(model)[2]


def _survey(model: nn.Module) -> tuple[list[tuple[str, nn.Module, LayerRule]], list[tuple[nn.Module, LayerRule]],
                                       list[str]]:
    """The modules owning trainable parameters with their rules and paths, the modules to prepare, and the
    problems found (every module is inspected: none stops the survey)."""
    managed, to_prepare, problems = [], [], []
    for path, module in model.named_modules():
        path = path or "<model>"
        where = f"{path} ({type(module).__name__})"
        if type(module).__module__.startswith("transformers."):
            # lazy: transformers is an optional extra: its layers' rules are registered by importing
            # hf_rules, done here the first time a model has one of its classes (never at import)
            import fedpriv.clipping.hf_rules  # noqa: F401
        if isinstance(module, _BatchNorm):
            problems.append(f"{where}: batch statistics mix samples, so per-sample gradients are not "
                            "defined; use nn.LayerNorm")
            continue
        rule = RULES.get(type(module))
        if rule is not None and rule.prepare is not None:
            to_prepare.append((module, rule))
        own = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        if rule is None:  # an nn.Linear / nn.Embedding subclass: recognised from its computation
            found = subclass_rule(module)
            if isinstance(found, str):
                problems.append(f"{where}: {found}")
                continue
            rule = found
        if rule is None:
            problems.append(f"{where} owns trainable parameter(s) {', '.join(own)} that BookKeeping "
                            f"cannot clip per sample: {_hint(module)}")
            continue
        extra = [n for n in own if n not in rule.params]
        if extra:
            problems.append(f"{where} has extra trainable parameter(s) {', '.join(extra)} that its rule "
                            f"does not cover: {_hint(nn.Module())}")
        problem = rule.check(module)
        if problem:
            problems.append(f"{where}: {problem}")
        if not extra and not problem:
            managed.append((path, module, rule))
    return managed, to_prepare, problems


class BookKeeping:
    """Per-sample (or per-group) clipping and Gaussian noise for ``model`` with the BK algorithm.

    ``bk = BookKeeping(model, clip_norm=C, noise_multiplier=σ, mode="mixopt", noise_key=None)``
    hooks ``model``; after a forward, ``bk.backward(per_sample_loss)`` sets every trainable
    ``p.grad = Σ_i min(1, C/||g_i||) g_i + σ·C·N(0, I)`` (σ = 0 → deterministic) and
    ``bk.last_norms`` to each unit's total
    gradient norm over all parameters, before clipping (``last_scales``: the factors c_i;
    ``last_methods``: per parameter name, "ghost", "instantiate", "mixed" (groups of different
    sizes took different methods) or "unused"). ``groups`` makes
    a group (all of one user's sequences) the clipping unit; units are the distinct ids in
    increasing order.

    The noise (:attr:`noise`, a :class:`~fedpriv.keys.keystream.GaussianKeystream`) is read from
    ChaCha20 under a 256-bit key. ``noise_key=None`` (the default, the secure mode): a fresh key
    from the OS CSPRNG, never stored or shown, so nobody can regenerate the noise — not even the
    caller. ``noise_key=<bytes>`` (at least 16): seeded, reproducible, and exactly as secret as
    those bytes — anyone holding them can subtract the noise, so a seeded engine is for research,
    never for a release. A seeded ``torch.Generator`` is refused: torch's CPU generator keeps 32
    bits of its seed, which a search over 2³² values recovers from a single noisy gradient.
    Assign ``bk.noise`` to switch streams between steps (a client's per-round key).

    Raises :class:`UnsupportedLayerError` (a ``ValueError``) at construction for a trainable
    parameter owned by any module type without a rule (``nn.LSTM``, ``nn.MultiheadAttention``,
    ``nn.GRU``, a bare ``nn.Parameter`` on a custom module, ...) and for BatchNorm, naming every such
    module in one message (:func:`validate` returns the list). Frozen parameters are ignored and get no
    grad. Every module whose rule has a ``prepare`` step is prepared (e.g. a recurrent cell switched to
    its step-by-step forward, so that its gate Linear calls are hooked) until :meth:`detach` undoes it.
    Use as a context manager to remove the hooks on exit.

    ``backward`` replays the step's forward with a random half of the samples perturbed (the RNG
    restored; every batch-first tensor argument, also inside tuples, lists, mappings and dataclasses;
    which samples, and how, drawn from keyed streams under a key derived from the engine's key, so a
    model cannot predict them and the same ``noise_key`` replays them:
    :class:`~fedpriv.clipping.provenance.KeyedDraws`) and refuses a model whose hooked calls' rows,
    or its return value's, of the other samples change: a model that mixes samples in its forward
    (:mod:`fedpriv.clipping.provenance`, 4; :class:`~fedpriv.clipping.replay.ForwardReplay`). It does
    so on the first ``REPLAY_FIRST`` (4) steps of the engine, on every ``replay_every``-th step after
    (default 8; 1: every step) and on every step whose arguments have shapes no replay has seen; a step
    with one sample is not replayed (nothing to compare). A replay is one more forward with grad
    enabled that saves nothing for a backward, ending before the last layer where the model returns
    that layer's output holding, by value, what the layer computed, that call ran nothing but the
    layer's registered forward, and its module's parameters, buffers and attributes print the same in
    the replay (docs/BENCHMARKS.md gives its cost). Every hooked call must be made inside the model's
    forward (the replay runs that forward again); the model may itself be one registered layer (a bare
    ``nn.Linear``; refusals name it ``<model>``).

    Every forward with grad enabled since the last ``backward`` counts (two passes of the model
    in one loss are both clipped together); recorded tensors are dropped by ``backward``, by
    :meth:`clear`, or when the model is next called with a different batch size. Calls under
    ``torch.no_grad()`` are not recorded.
    """

    def __init__(self, model: nn.Module, clip_norm: float = 1.0, noise_multiplier: float = 0.0,
                 mode: str = "mixopt", noise_key: Optional[bytes] = None, replay_every: int = REPLAY_EVERY) -> None:
        if isinstance(replay_every, bool) or not isinstance(replay_every, int) or replay_every < 1:
            raise ValueError(f"replay_every must be an integer >= 1, got {replay_every!r}")
        if not clip_norm > 0 or clip_norm == float("inf"):
            raise ValueError(f"clip_norm must be positive and finite, got {clip_norm}")
        if not noise_multiplier >= 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.model = model
        self.clip_norm = float(clip_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.mode = mode
        self.replay_every = replay_every
        key = stream_key(noise_key)  # the noise's key: fresh OS entropy, or the caller's (research)
        self.noise = GaussianKeystream(key)
        self.last_norms: Optional[Tensor] = None
        self.last_scales: Optional[Tensor] = None
        self.last_methods: dict[str, str] = {}
        self._params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._calls: list[_Call] = []
        self._provenance = Provenance(model)  # what the forwards since the last backward proved
        self._separability_checked = False
        self._proven_made_inside: set[str] = set()  # paths of made-inside calls the probe proved per sample
        self._in_backward = False
        managed, to_prepare = self._inspect(model)
        # profiler labels (scripts/profile_bk.py): "bk.<phase>.<layer kind>"
        self._kind = {id(p): type(module).__name__ for _, module, _ in reversed(managed)
                      for p in module.parameters(recurse=False)}
        self._undo: list[Callable[[], None]] = [rule.prepare(module) for module, rule in to_prepare]
        self._by_path = {path: module for path, module, _ in managed}
        # the root's pre-hook first and its hook last, so that where the model is itself a hooked layer (a bare
        # nn.Linear) its own call is made inside the model's forward
        self._handles = [model.register_forward_pre_hook(self._on_root, with_kwargs=True)]
        self._recorded: list[nn.Module] = []
        for path, module, rule in managed:
            hook = self._make_hook(path, rule, f"bk.hooks.{type(module).__name__}")
            self._handles.append(module.register_forward_hook(hook, with_kwargs=True))
            self._handles.append(module.register_forward_pre_hook(self._make_pre_hook(path), with_kwargs=True))
            _RECORDERS[module] = hook
            self._recorded.append(module)
        self._handles.append(model.register_forward_hook(self._off_root, always_call=True))
        # the proof that the model does not mix samples in its forward (replay.py): its draws keyed from the same
        # key as the noise; this engine's hooks are its own code (any other is foreign code)
        self._replay = ForwardReplay(model, key, replay_every, self._by_path, {handle.id for handle in self._handles})
        FLAT_LISTENERS.add(self._replay)

    # ------------------------------------------------------------------ set-up

    @staticmethod
    def _inspect(model: nn.Module) -> tuple[list[tuple[str, nn.Module, LayerRule]],
                                            list[tuple[nn.Module, LayerRule]]]:
        """Modules owning trainable parameters, each with its rule and path (``<model>`` for the model
        itself), and the modules (trainable or not) whose rule has a ``prepare`` step; raise one
        :class:`UnsupportedLayerError` naming every problem (:func:`validate`) if there is any. Changes nothing."""
        managed, to_prepare, problems = _survey(model)
        if problems:
            raise UnsupportedLayerError("; ".join(problems))
        return managed, to_prepare

    def _make_hook(self, path: str, rule: LayerRule, label: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any, recorded: bool = False):
            with record_function(label):
                return self._on_forward(path, rule, module, args, kwargs, output, recorded)
        return hook

    def _make_pre_hook(self, path: str):
        def pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            self._replay.before_call(path, module, args, kwargs)
        return pre_hook

    def detach(self) -> None:
        """Remove all hooks, undo every module's ``prepare`` step, drop recorded tensors."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for module in self._recorded:
            _RECORDERS.pop(module, None)
        FLAT_LISTENERS.discard(self._replay)
        self._recorded = []
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        self.clear()

    def clear(self) -> None:
        """Drop the calls recorded since the last backward (e.g. after an abandoned forward)."""
        self._calls = []
        self._replay.clear()
        self._provenance.reset()

    def __enter__(self) -> "BookKeeping":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.detach()

    @property
    def replay_due(self) -> bool:
        """Whether the next step's forward is replayed by the schedule (:attr:`ForwardReplay.due`)."""
        return self._replay.due

    @property
    def replay_pending(self) -> bool:
        """Whether the forward(s) run since the last backward will be replayed by the next one."""
        return self._replay.pending

    @property
    def recorded_calls(self) -> int:
        """Number of module calls kept for the next backward (0 right after a backward)."""
        return len(self._calls)

    # ------------------------------------------------------------------ forward side

    def _on_root(self, module: nn.Module, args: tuple, kwargs: dict):
        """The model's first tensor argument fixes the batch size (batch-first). Its tensor inputs
        become the sources of per-sample provenance; float inputs that do not require grad are
        replaced by leaves that do, so autograd traces every computation on them
        (:meth:`Provenance.trace_input`)."""
        if self._in_backward or not torch.is_grad_enabled():
            return None
        x = first_tensor(args, kwargs)
        if x is None or x.dim() == 0:
            return None
        proof = self._provenance
        proof.call_args = (args, dict(kwargs))  # replayed on perturbed values (check_data_independent)
        if self._calls and proof.batch is not None and x.shape[0] != proof.batch:
            self.clear()  # a new batch size: the pending calls belong to an abandoned forward
        proof.set_batch(x)
        self._replay.begin(args, kwargs, x)  # kept to be replayed, where due
        new_args = tuple(proof.trace_input(a) for a in args)
        new_kwargs = {k: proof.trace_input(v) for k, v in kwargs.items()}
        changed = any(a is not b for a, b in zip(new_args, args)) or any(new_kwargs[k] is not kwargs[k] for k in kwargs)
        return (new_args, new_kwargs) if changed else None

    def _off_root(self, module: nn.Module, args: tuple, output: Any) -> None:
        """The model's forward has returned (or raised): :meth:`ForwardReplay.end`."""
        self._replay.end(output)

    def _on_forward(self, path: str, rule: LayerRule, module: nn.Module, args: tuple,
                    kwargs: dict, output: Any, recorded: bool = False) -> Optional[Tensor]:
        if self._replay.running:  # a call of a replay (not of a step): compared or recorded there
            return self._replay.on_call(path, module, args, kwargs, output, recorded)
        if self._in_backward or not isinstance(output, Tensor) or not output.requires_grad:
            return None
        x = first_tensor(args, kwargs)
        leaf = x if x.requires_grad and x.grad_fn is None else None
        node = x.grad_fn
        proof = self._provenance
        rows = proof.positions(path, module, x)
        if rows is not None:  # flattened positions of a per-sample tensor (flat_positions)
            self._replay.record(path, module, "positions", x, output, recorded, rows)
            proof.add_output(output)
            self._calls.append(_Call(path, module, rule, x.detach(), get_gradient_edge(output), node, leaf, rows))
            return None
        batched = proof.batched(path, rule, module, x)
        replaced = not batched
        if not batched:
            self._replay.record(path, module, "whole", x, output, recorded, expand="shared")
            x, output = proof.expand_shared(x, output)
        elif path in proof.made_inside and x.shape[0] == 1 and proof.batch > 1:
            self._replay.record(path, module, "whole", x, output, recorded, expand="broadcast")
            x, output = proof.expand_broadcast(x, output)  # on probation (provenance.py, 2 and 3)
            replaced = True
        else:
            self._replay.record(path, module, "rows", x, output, recorded)
        proof.add_output(output)
        self._calls.append(_Call(path, module, rule, x.detach(), get_gradient_edge(output), node, leaf))
        return output if replaced else None

    # ------------------------------------------------------------------ backward side

    def backward(self, per_sample_loss: Tensor,
                 groups: Optional[Union[Tensor, Sequence[int]]] = None) -> None:
        """Set every trainable ``p.grad`` to the clipped (per sample or per group) sum plus noise.

        ``per_sample_loss``: [B], entry i depends only on sample i. ``groups``: [B] integer ids;
        then a group's summed gradient is the unit clipped, and ``last_norms`` has one entry per
        distinct id, in increasing id order.
        """
        calls, batch = self._calls, self._provenance.batch
        made_shared, call_args = self._provenance.made_shared, self._provenance.call_args
        made_inside = dict(self._provenance.made_inside)  # per-sample calls on probation
        forwards, outside = self._replay.take()  # (the step counted for the replay's schedule)
        self.clear()
        if per_sample_loss.dim() != 1:
            raise ValueError("per_sample_loss must have shape [B], got "
                             f"{tuple(per_sample_loss.shape)}")
        if per_sample_loss.grad_fn is None:
            raise ValueError("per_sample_loss does not depend on any trainable parameter "
                             "(was the forward run under torch.no_grad()?)")
        size = per_sample_loss.shape[0]
        for call in calls:
            if call.rows is not None:
                if call.rows.numel() and int(call.rows.max()) >= size:
                    raise ValueError(f"{call.path} ran on positions of sample {int(call.rows.max())} but "
                                     f"per_sample_loss has {size} entries")
            elif call.input.shape[0] != size:
                raise ValueError(
                    f"{call.path} was called with batch dim {call.input.shape[0]} but "
                    f"per_sample_loss has {size} entries; inputs must be batch-first "
                    f"(do not flatten batch and time before a layer); model batch was {batch}")
        with record_function("bk.audit"):
            self._audit(per_sample_loss, calls)
        self._replay.check_independent(made_shared, call_args)
        self._in_backward = True
        try:
            # the probe runs on the first backward, where a shape is ambiguous, and until every call on a
            # batch-shaped tensor made inside the model has been proven per sample
            check = bool(calls) and size > 1 and (not self._separability_checked or ambiguous_batch_dim(calls, size)
                                                   or not made_inside.keys() <= self._proven_made_inside)
            if check:
                with record_function("bk.separability_check"):
                    probe = separability_probe(per_sample_loss, calls)
            with record_function("bk.output_gradients"):
                grads = torch.autograd.grad(per_sample_loss.sum(), [c.edge for c in calls],
                                            allow_unused=True) if calls else ()
            if check:
                with record_function("bk.separability_check"):
                    check_separable(calls, grads, *probe, notes=made_inside)
                self._separability_checked = True
                self._proven_made_inside |= made_inside.keys()
            with record_function("bk.forward_replay"):  # before any p.grad is written
                self._replay.run(forwards, outside)
        finally:
            self._in_backward = False
        # the DP arithmetic in IEEE float32 from float32 copies, whatever client.precision ran the
        # forward and backward in (fedpriv/precision.py): norms and clipped sums from the same values
        with torch.no_grad(), exact_fp32():
            grouping = None
            if groups is not None:
                ids = torch.as_tensor(groups, device=per_sample_loss.device)
                if ids.shape != (size,):
                    raise ValueError(f"groups must have shape [{size}], got {tuple(ids.shape)}")
                grouping = Grouping.from_ids(ids)
            units = grouping.num_units if grouping else size
            contributions: dict[int, list[Contribution]] = defaultdict(list)
            position_units: dict[int, Grouping] = {}  # parameter -> its flattened positions' units
            plain: set[int] = set()  # parameters with contributions from calls on batch rows
            for call, g in zip(calls, grads):
                if g is not None and (call.rows is None or call.rows.numel()):  # no position: nothing to add
                    with record_function(f"bk.contributions.{type(call.module).__name__}"):
                        positions = None if call.rows is None else Grouping.from_units(
                            call.rows if grouping is None else grouping.unit[call.rows], units)
                        for p, c in call.rule.contributions(call.module, as_fp32(call.input), as_fp32(g)):
                            contributions[id(p)].append(c)
                            if positions is None:
                                plain.add(id(p))
                            elif id(p) in position_units:
                                raise UnsupportedLayerError(
                                    f"{call.path} ({type(call.module).__name__}): a parameter is used in more than "
                                    "one call on flattened positions; flatten once")
                            else:
                                position_units[id(p)] = positions
            mixed = plain & set(position_units)
            if mixed:
                names = sorted(n for n, p in self._params if id(p) in mixed)
                raise UnsupportedLayerError(
                    f"parameter(s) {', '.join(names)} are used both on flattened positions and on batch rows "
                    "(a tied weight?); per-sample clipping needs one layout per parameter")
            del calls, grads
            self._clip_and_noise(contributions, grouping, units, as_fp32(per_sample_loss).dtype, position_units)

    def _clip_and_noise(self, contributions: dict[int, list[Contribution]],
                        grouping: Optional[Grouping], units: int, dtype: torch.dtype,
                        position_units: Optional[dict[int, Grouping]] = None) -> None:
        """Norms (ghost or instantiated per parameter), clip factors, weighted sums, noise.
        ``position_units``: for a parameter used on flattened positions, the unit of each position
        (its contributions are per position, and a unit's are summed as a group's)."""
        position_units = position_units or {}
        device = self._params[0][1].device if self._params else None
        sq_norms = torch.zeros(units, dtype=dtype, device=device)
        plans: list[tuple[nn.Parameter, list[Contribution]]] = []
        methods: dict[str, str] = {}
        per_unit: set[int] = set()  # parameters whose parts are their units' kept gradients
        kept = 0
        for name, p in self._params:
            with record_function(f"bk.norms.{self._kind.get(id(p), 'unknown')}"):
                parts = _merge(contributions.pop(id(p), []))
                by_unit = position_units.get(id(p), grouping)
                if not parts:
                    methods[name] = "unused"
                elif by_unit is not None:
                    # the units' instantiated gradients are kept for the clipped sum when they fit
                    room = kept + by_unit.num_units * p.numel() <= _KEEP_BUDGET
                    methods[name], rows = self._add_group_norms(p, parts, by_unit, sq_norms, keep=room)
                    if rows is not None:  # every unit's row: the sum needs no second formation
                        kept += rows.numel()
                        parts = [Dense(rows.view((by_unit.num_units,) + tuple(p.shape)))]
                        per_unit.add(id(p))
                elif self._use_ghost(p, parts, _steps(parts)):
                    methods[name] = "ghost"
                    sq_norms += _ghost_sq_norms(parts)
                else:
                    methods[name] = "instantiate"
                    total = _instantiate(parts, p.shape)
                    sq_norms += total.reshape(units, -1).pow(2).sum(1)
                    parts = [Dense(total)]
            plans.append((p, parts))
        norms = sq_norms.clamp_min(0).sqrt()
        scales = self.clip_norm / norms.clamp_min(self.clip_norm)
        # the sums run over samples (or flattened positions): each one's factor is its unit's
        coef = scales if grouping is None else scales[grouping.unit]
        std = self.noise_multiplier * self.clip_norm
        grads = []
        for p, parts in plans:
            grad = None
            with record_function(f"bk.clipped_sum.{self._kind.get(id(p), 'unknown')}"):
                by_position = position_units.get(id(p))
                if id(p) in per_unit:
                    factors = scales.to(p.dtype)
                else:
                    factors = (coef if by_position is None else scales[by_position.unit]).to(p.dtype)
                for c in parts:
                    grad = weighted_sum(c, factors, p.shape, out=grad)
                if grad is None:
                    grad = torch.zeros_like(p)
            grads.append(grad.contiguous())
        with record_function("bk.noise"):
            self.noise.add_(grads, std)
        for (p, _), grad in zip(plans, grads):
            p.grad = grad
        self.last_norms = norms
        self.last_scales = scales
        self.last_methods = methods

    def _add_group_norms(self, p: nn.Parameter, parts: list[Contribution], grouping: Grouping,
                         sq_norms: Tensor, keep: bool = False) -> tuple[str, Optional[Tensor]]:
        """Add each unit's squared norm for ``p`` to ``sq_norms``, one batch per bucket of
        equal-size units (no padding to the largest unit); ghost or instantiated per bucket by
        its units' position count. Returns "ghost", "instantiate", or "mixed" across buckets, and
        with ``keep`` and every bucket instantiated the units' gradients [units, numel] (a unit in
        no bucket: a zero row), so that the clipped sum need not form them again."""
        rows_of: Optional[Tensor] = None
        used = set()
        for units, members in grouping.buckets:
            view = [bucket_view(c, members) for c in parts]
            if self._use_ghost(p, view, _steps(view)):
                used.add("ghost")
                sq_norms[units] += _ghost_sq_norms(view)
                continue
            used.add("instantiate")
            step = max(1, _INSTANTIATE_BUDGET // p.numel())  # bound the [k, numel] buffer
            for start in range(0, len(units), step):
                part = [bucket_view(c, members[start:start + step]) for c in parts]
                rows = _instantiate(part, p.shape).flatten(1)
                sq_norms[units[start:start + step]] += rows.pow(2).sum(1)
                if keep and "ghost" not in used:
                    if rows_of is None:
                        covered = sum(len(u) for u, _ in grouping.buckets) == grouping.num_units
                        rows_of = (torch.empty if covered else torch.zeros)(
                            (grouping.num_units, p.numel()), dtype=rows.dtype, device=rows.device)
                    rows_of[units[start:start + step]] = rows
        method = used.pop() if len(used) == 1 else ("mixed" if used else "unused")
        return method, (rows_of if method == "instantiate" else None)

    def _use_ghost(self, p: nn.Parameter, parts: list[Contribution], steps: int) -> bool:
        """Ghost norm for ``p``? Never for Dense parts; for ``mixopt`` iff ``2·T² < numel``
        (``steps`` = T, the positions of one clipping unit over all uses of ``p``)."""
        if self.mode == "instantiate" or any(isinstance(c, Dense) for c in parts):
            return False
        if self.mode == "ghost":
            return True
        return 2 * steps * steps < p.numel()

    def _audit(self, loss: Tensor, calls: list[_Call]) -> None:
        """Fail if a trainable parameter reaches the loss other than through a recorded call.

        Walks the autograd graph from the loss; at each recorded call's output node it jumps to
        the call's input instead of descending into the layer, so any parameter leaf still
        reached is used where no hook sees it (``F.linear(x, layer.weight)``, a fused LSTM kernel,
        a loss term on the weights) and its gradient would be silently missed.
        """
        managed = {id(p): n for n, p in self._params}
        hidden: set[str] = set()
        cut: dict[Any, list[Any]] = defaultdict(list)
        for call in calls:
            cut[call.edge.node].append(call.input_node)
            if call.input_leaf is not None and id(call.input_leaf) in managed:
                hidden.add(managed[id(call.input_leaf)])
        stack, seen = [loss.grad_fn], set()
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if node in cut:
                stack.extend(cut[node])
                continue
            var = getattr(node, "variable", None)
            if var is not None:
                if id(var) in managed:
                    hidden.add(managed[id(var)])
                continue
            stack.extend(fn for fn, _ in node.next_functions)
        if hidden:
            raise UnsupportedLayerError(
                f"parameter(s) {', '.join(sorted(hidden))} reach the loss outside a call of their "
                "module (functional use such as F.linear(x, layer.weight), a fused kernel, or a "
                "loss term on the weights), so BookKeeping would miss that part of their "
                "gradient; call the module itself (weight decay belongs in the optimizer)")


def _steps(parts: list[Contribution]) -> int:
    """Positions per unit over all factored parts of one parameter (T of the mixopt rule)."""
    return sum(c.steps for c in parts if not isinstance(c, Dense))


def _ghost_sq_norms(parts: list[Contribution]) -> Tensor:
    """``‖Σ_k G^k_i‖²`` per unit from factored parts, with their cross terms."""
    total = cross(parts[0], parts[0])
    for i, x in enumerate(parts):
        if i:
            total = total + cross(x, x)
        for y in parts[i + 1:]:
            total = total + 2 * cross(x, y)
    return total


def _instantiate(parts: list[Contribution], shape: torch.Size) -> Tensor:
    """``Σ_k G^k_i`` per unit, [B, *shape]."""
    total = per_sample(parts[0], shape)
    for c in parts[1:]:
        total = total + per_sample(c, shape)
    return total


def _merge(parts: list[Contribution]) -> list[Contribution]:
    """At most one contribution per kind: same-kind parts concatenated along positions."""
    by_kind: dict[type, list[Contribution]] = defaultdict(list)
    for c in parts:
        by_kind[type(c)].append(c)
    return [concat(group) for kind in (Outer, Rows, Dense) if (group := by_kind.get(kind))]
