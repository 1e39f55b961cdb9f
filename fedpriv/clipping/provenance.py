"""The per-sample provenance proof of Book-Keeping (:mod:`fedpriv.clipping.engine`): which rows of
a hooked call belong to which sample, proven from autograd's graph, never guessed from a shape.

What it proves, for every hooked module call of one step:

1. *Provenance of the input* (:meth:`Provenance.batched`). A call's input is per sample if it is
   the model's input or a view of it with the same dim 0, or a float tensor that autograd derives
   from the model's input or from an earlier hooked call (the model's float inputs are given
   ``requires_grad`` so that every computation on them is traced). It is *shared* by all samples if
   it is computed from neither — a buffer, a frozen weight, position ids ``arange(T)`` — whatever
   its dim 0 (a shared ``[T, d]`` tensor with T == B is not a batch). Anything else fails closed,
   naming the module: a view of the input whose dim 0 is not the batch (flattened, transposed), a
   batch-dependent tensor broadcast over dim 0 (stride 0), or a batch-shaped tensor made inside the
   model that fails the checks of 2 and 3. A shared call's output is returned with a new leading
   batch dim (an ``expand`` view, which broadcasts exactly as the original did), so each sample
   gets its own part of the gradient. Two declarations extend the proof where autograd cannot see:
   :func:`computed_from` (a tensor computed without autograd from a per-sample source) and
   :func:`flat_positions` (positions of a per-sample tensor flattened to rows); each is accepted
   only if its source is itself proven per sample.
2. *Independence of shared inputs from the samples* (:func:`check_data_independent`). A shared
   input made in the forward (not a buffer or frozen weight: positions ``arange(T)``, or possibly
   a batch statistic computed without autograd) must not depend on the samples: the engine replays
   the model's forward once per layer, without autograd and with the RNG streams restored, on
   :func:`perturbed` arguments, and fails if such an input changed — it would otherwise carry
   every sample's data into every sample's clipped gradient. A *batch-shaped* input made in the
   forward (positions ``arange(T).expand(B, T)``, or ``arange(T)[None]`` whose size-1 dim 0
   broadcasts over the batch and is expanded to it) is taken as per sample on probation: it must
   pass this replay and the separability probe below on its layer's first backward.
3. *Separability of the loss* (:func:`separability_probe`, :func:`check_separable`). No sample's
   loss depends on another sample's row of a hooked call's output: a second backward with random
   per-sample weights must scale each row's output gradient by its own sample's weight. The weights
   are signed powers of two (:func:`probe_weights`), so that for a separable model the scaling is
   exact in floating point, rounding included (a non-dyadic weight changed the rounding of a
   gradient that is zero in exact arithmetic, an attention query over one key, and refused sound
   models); distinct weights differ by a factor of at least 2. It runs on
   an engine's first backward and whenever some hooked input has the batch size in another dim
   too (:func:`ambiguous_batch_dim`), where a permutation of the batch with that dim keeps every
   shape.
4. *No row depends on another sample in the forward* (the engine's forward replay,
   :func:`replay_mismatch`). 1 proves that *some* sample reaches each row, and 3 sees backward
   dependence only: a batch-centred input, or a detached batch statistic added between two layers,
   passes both. The engine runs the step's forward again, with autograd on and torch's RNG streams
   reset to where the forward started (dropout draws the same masks), on arguments whose rows of a
   random half of the samples are :func:`perturbed` (:func:`perturb_samples`: every tensor whose
   dim 0 is the batch, the argument itself or inside its tuples, lists, mappings and dataclasses
   (:func:`map_tensors`); at least one sample perturbed, one kept; which, and how, drawn under the
   engine's key: :class:`KeyedDraws`),
   and fails if any hooked call's input rows of a kept sample differ in one bit — for flattened
   positions, the rows of kept samples, in order; for a shared call, its whole input — or its
   output rows, for a call whose output is not computed by a registered layer's own forward (a
   subclass accepted by its computation, a :func:`record_call` product), or if the sequence of
   calls changes. The output of a registered layer type (``RULES``) is not compared:
   its forward computes output row i from input row i and the parameters alone. The model's return
   value, what the per-sample loss is computed from, is (:func:`output_prints`: each tensor in it,
   found by :func:`map_tensors`, by rows, flattened positions, or whole; a return value holding none
   is refused), so mixing after the last hooked call is seen; only where the model returns its last
   call's output itself, or a view within its rows (:func:`rows_within`), holding the values that
   call computed, that call is a registered layer's and nothing but that layer's registered forward
   ran in it (no foreign hook, global hook, torch function or dispatch mode, replaced ``forward``,
   tensor subclass: the replay's ``ForwardReplay._only_own_code``), its compared input and its module's state
   (:func:`state_print`: parameters, buffers, public attributes) suffice and the replay ends before
   that call (a language model's output layer, its largest product, is not computed again); only the
   engine ends a replay early (a model raising the engine's exceptions is refused). "Holding the
   values" is judged by value, not by autograd's
   version counter (which a write through ``.data`` or numpy does not bump): :func:`value_print` of
   that output when the call returns and when the model does must agree (the call is the one whose
   output the previous replayed forward returned; the first replayed forward is replayed whole). A
   flattened output (rows of :func:`flat_positions`, through a frozen head, say) is attributed to its
   rows' samples. It runs on an engine's first steps, on every ``replay_every``-th step after (the
   engine's schedule), and at each shape of the model's arguments not replayed before.

Assumptions: dim 0 of the model's input is the batch; a shared input that depends on the samples
changes under the replay's perturbation (integer inputs resampled from their own values, float
inputs plus unit noise; a dependence that this leaves unchanged goes unnoticed), and the model's
forward can be run again (no side effects that matter); the model modifies neither its float inputs
nor a hooked call's input in place; a module that declares :func:`computed_from` owns the claim's
truth; views are recognised by their storage (a view of the input shares its storage); the model's
structure does not change between backwards without an ambiguous batch dim (the separability check
is then not repeated); a dependence across samples smaller than the check's tolerance (1e-3
relative, on per-row fingerprints), or only between samples that drew the same probe weight (none
in a batch of up to 122; each other pair with probability 1/122), goes unnoticed; and the backward
is linear in its upstream gradient and reproducible, so that a power-of-two weight scales it
exactly (a kernel whose summation order changes between two backwards, GPU atomics, may still
show rounding noise above the tolerance where a gradient is a cancellation: a refusal, never a
pass). Of the forward replay: a forward that mixes
samples does so at the replayed steps too (between two replays its mixing is assumed the same as at
the next one, or at the first replay of its arguments' shapes; ``replay_every=1`` replays every
step); a kept row that depends on a perturbed sample changes in some bit (a dependence the
perturbation leaves unchanged, or one on kept samples only, is seen only at a replay whose random
half separates them); per-sample data reaches the forward only through its arguments, as tensors or
inside tuples, lists, mappings and dataclasses (data held by the module, a global, or another kind
of object is not perturbed), and the loss only through tensors the return value holds so; a write
behind autograd into the returned last-layer output that leaves its :func:`value_print` unchanged
(every row's wrapping bit sum and every secret projection) goes unnoticed; the forward reads no
state that earlier batches wrote other than the parameters, and does not differentiate inside
itself (the replay saves nothing for a backward: such a forward is refused); a registered rule's
module computes its output row by row from its input and :func:`state_print` (an attribute neither
a tensor nor plain is compared by identity); where the replay ends early, torch itself is not
changed under the forward (a hook written into torch's private hook dictionaries behind its
registration API and removed within the call, or a replaced torch function, is not seen);
and the per-sample loss is formed from the model's return value row by row (the engine cannot run
the caller's loss computation again: 3 sees a backward dependence there on the first backward only,
and a detached statistic over the batch inside the loss computation goes unnoticed).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import weakref
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from fedpriv.clipping.rules import LayerRule
from fedpriv.errors import ConfigError
from fedpriv.keys.keystream import GaussianKeystream
from fedpriv.keys.randomness import KEY_BYTES, keystream, uint64s

# the attached engines' forward replays (``flattened(rows)`` is called for each :func:`flat_positions`; the
# replay attributes a model output with that many rows to those samples)
FLAT_LISTENERS: "weakref.WeakSet[Any]" = weakref.WeakSet()
_SOURCE = "_fedpriv_computed_from"
_POSITIONS = "_fedpriv_positions_of"


class UnsupportedLayerError(ConfigError):
    """The model has a trainable parameter BK cannot clip per sample (a ``ValueError``).

    Raised by ``BookKeeping(...)`` for a parameter owned by an unsupported module type, and by
    ``backward`` when a parameter is used outside a call of its module (functional use, a fused
    kernel), which hooks cannot see; by the proof of this module where a call's rows cannot be
    proven per sample. Never a silent pass.
    """


class RecordedCall(Protocol):
    """What the proof reads of one recorded module call (the engine's ``_Call``)."""

    path: str
    module: nn.Module
    input: Tensor
    edge: Any  # torch.autograd.graph.GradientEdge of the output
    rows: Optional[Tensor]  # a call on flattened positions: the sample of each input row


def expand_rows(x: Tensor, output: Tensor, batch: int, new_dim: bool) -> tuple[Tensor, Tensor]:
    """``x`` and ``output`` as ``expand`` views with ``batch`` rows: a new leading dim (a shared
    call), or their size-1 dim 0 expanded (a made-inside call that broadcasts over the batch)."""
    if new_dim:
        x, output = x.unsqueeze(0), output.unsqueeze(0)
    return x.expand((batch,) + tuple(x.shape[1:])), output.expand((batch,) + tuple(output.shape[1:]))


def declared_rows(x: Tensor) -> Optional[Tensor]:
    """The sample of each row of ``x`` if :func:`flat_positions` made it, else None (unchecked)."""
    declared = getattr(x, _POSITIONS, None)
    return None if declared is None else declared[1]


def computed_from(value: Tensor, source: Tensor) -> Tensor:
    """Declare that row i of ``value`` (a tensor a module computed without autograd, e.g. the
    states of a recurrence run under ``torch.no_grad()``) depends only on row i of ``source``, a
    tensor of the same forward. A hooked call on ``value`` is then per sample iff ``source`` is
    (proven as for any input; otherwise the call fails closed). The declaring module owns the
    claim's truth, and its back-propagation must carry all of ``value``'s effect on the loss
    (``value`` gets no gradient). Returns ``value``."""
    setattr(value, _SOURCE, source)
    return value


def flat_positions(x: Tensor, keep: Tensor) -> Tensor:
    """``x[keep]``: the positions of a per-sample ``x`` [B, T, ...] where ``keep`` [B, T] is true,
    flattened to [N, ...] (e.g. an LM's output layer run only on non-pad targets), declared so
    that an attached engine attributes row n to sample ``keep.nonzero()[n, 0]``. A hooked call on
    the result is clipped per sample as if it ran on all of ``x`` with zero output gradient at the
    dropped positions (the same gradients). Accepted only if ``x`` is itself proven per sample;
    a parameter used both on flattened positions and on batch rows in one step is refused (at
    ``backward``)."""
    if keep.shape != x.shape[:2] or keep.dtype != torch.bool:
        raise ValueError(f"keep must be a bool mask of shape {tuple(x.shape[:2])}, got {keep.dtype} "
                         f"{tuple(keep.shape)}")
    flat = x[keep]
    rows = torch.nonzero(keep)[:, 0]
    setattr(flat, _POSITIONS, (x, rows))
    for listener in list(FLAT_LISTENERS):  # engines attribute a flattened model output to samples
        listener.flattened(rows)
    return flat


class Provenance:
    """What the forwards since the last reset have proven per sample (see the module docstring).

    ``batch``: the batch size, fixed by the model's first tensor argument (:meth:`set_batch`);
    ``index_ndim``: the dims of that argument if it holds indices. The model's tensor inputs
    (:meth:`trace_input`) and the outputs of hooked calls (:meth:`add_output`) are the sources of
    per-sample provenance; :meth:`batched` and :meth:`positions` prove a call's input from them.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.reset()

    def reset(self) -> None:
        """Forget every forward (the next one starts a new batch)."""
        self.batch: Optional[int] = None
        self.index_ndim: Optional[int] = None
        self.roots: list[Tensor] = []  # the model's tensor inputs in this forward (views of them are per sample)
        self.sources: set[Any] = set()  # autograd nodes whose values are per sample (call outputs, inputs)
        self.root_leaves: set[int] = set()  # ids of the model's float inputs that are autograd leaves
        self.shared_storages: set[int] = set()  # storages of shared calls' (expanded) outputs
        self.call_args: Optional[tuple[tuple, dict]] = None  # the model's arguments in this forward
        # shared calls whose input is made in the forward (not a buffer or frozen weight): (path, input),
        # proven independent of the samples by :func:`check_data_independent`
        self.made_shared: list[tuple[str, Tensor]] = []
        # calls on batch-shaped tensors made in the forward, taken as per sample on probation (path ->
        # what was assumed, for a refusal) until the separability probe proves it
        self.made_inside: dict[str, str] = {}

    def set_batch(self, x: Tensor) -> None:
        """The model's first tensor argument ``x`` fixes the batch size (batch-first), and the dims
        of an index input (a hooked layer with an index input sees at least as many)."""
        self.batch = x.shape[0]
        if not (x.is_floating_point() or x.is_complex()):
            self.index_ndim = x.dim()

    def trace_input(self, value: Any) -> Any:
        """Make one of the model's arguments a source of per-sample provenance: a float tensor that
        does not require grad is replaced by a leaf that does, so autograd traces every computation
        on it. Returns the argument to pass on."""
        if not isinstance(value, Tensor) or value.dim() == 0:
            return value
        if value.is_floating_point() and not value.requires_grad:
            value = value.detach().requires_grad_(True)
        self.roots.append(value)
        if value.requires_grad:
            if value.grad_fn is None:
                self.root_leaves.add(id(value))
            else:
                self.sources.add(value.grad_fn)
        return value

    def add_output(self, output: Tensor) -> None:
        """A hooked call's (per-sample) output: what autograd derives from it is per sample."""
        self.sources.add(output.grad_fn)

    def expand_broadcast(self, x: Tensor, output: Tensor) -> tuple[Tensor, Tensor]:
        """A made-inside call whose size-1 dim 0 broadcasts over the batch: input and output
        expanded along that dim to the batch (``expand`` views; the forward is unchanged wherever
        that dim broadcasts against the batch, and elsewhere the shapes break or the probe refuses)."""
        return expand_rows(x, output, self.batch, new_dim=False)

    def expand_shared(self, x: Tensor, output: Tensor) -> tuple[Tensor, Tensor]:
        """A shared call's input and output with a new leading batch dim (``expand`` views); the
        output's storage is remembered, so a later call on it is not taken for a broadcast batch."""
        x, output = expand_rows(x, output, self.batch, new_dim=True)
        self.shared_storages.add(output.untyped_storage().data_ptr())
        return x, output

    def positions(self, path: str, module: nn.Module, x: Tensor) -> Optional[Tensor]:
        """The sample of each row of ``x`` if :func:`flat_positions` made it (else None); raise
        :class:`UnsupportedLayerError` if the tensor it flattened is not proven per sample."""
        declared = getattr(x, _POSITIONS, None)
        if declared is None:
            return None
        source, rows = declared
        batch = self.batch
        if batch is None or not (source.dim() >= 2 and source.shape[0] == batch and rows.shape == (x.shape[0],)
                                 and not (batch > 1 and source.stride(0) == 0)
                                 and (any(source is r for r in self.roots) or self.derived_from_batch(source))):
            raise UnsupportedLayerError(
                f"{path} ({type(module).__name__}): its input {tuple(x.shape)} holds flattened positions of a tensor "
                f"that is not derived from the batch of {batch} in dim 0")
        return rows

    def batched(self, path: str, rule: LayerRule, module: nn.Module, x: Tensor) -> bool:
        """Whether a call's input is per sample (dim 0 the batch) or shared by all samples; raise
        :class:`UnsupportedLayerError` where neither can be proven (see the module docstring)."""
        where = f"{path} ({type(module).__name__})"
        batch = self.batch
        if batch is None:
            raise UnsupportedLayerError(f"{where} was called before the model itself: call the model (batch-first) so "
                                        "BookKeeping knows the batch")
        shape = tuple(x.shape)
        storage = x.untyped_storage().data_ptr() if x.numel() else None
        root = next((r for r in self.roots if r.numel() and r.untyped_storage().data_ptr() == storage), None)
        if root is not None:  # the model's input, or a view of it
            if (x.dim() >= rule.min_batched_ndim(module) and x.shape[0] == root.shape[0] == batch
                    and (batch == 1 or x.stride(0) == root.stride(0))  # a size-1 dim's stride means nothing
                    and not (rule.index_input and x.dim() < (self.index_ndim or 0))):
                return True
            raise UnsupportedLayerError(
                f"{where}: its input {shape} is a view of the model's input whose dim 0 is not the batch of {batch} "
                "(flattened or transposed?); keep the batch in dim 0 before every hooked layer")
        source = getattr(x, _SOURCE, None)
        if source is not None:  # declared by a module: computed without autograd from ``source``
            if x.shape[0] != batch or x.dim() < rule.min_batched_ndim(module) or not (
                    isinstance(source, Tensor) and source.dim() and source.shape[0] == batch
                    and (any(source is r for r in self.roots) or self.derived_from_batch(source))):
                raise UnsupportedLayerError(
                    f"{where}: its input {shape} is declared computed from a per-sample tensor, but that tensor "
                    f"is not derived from the batch of {batch} in dim 0")
            return True
        if x.is_floating_point() and self.derived_from_batch(x):
            if x.dim() < rule.min_batched_ndim(module) or x.shape[0] != batch:
                raise UnsupportedLayerError(
                    f"{where}: its input {shape} is computed from the batch but its dim 0 is not the batch of {batch} "
                    "(flattened or transposed?); keep the batch in dim 0 before every hooked layer")
            if batch > 1 and x.stride(0) == 0 and storage not in self.shared_storages:
                raise UnsupportedLayerError(
                    f"{where}: its input {shape} is one batch-dependent tensor broadcast over dim 0 (stride 0), so its "
                    "rows are not per sample; per-sample clipping needs each sample's own input")
            return True
        constant = storage in self.constant_storages()
        batch_shaped = x.dim() >= rule.min_batched_ndim(module) and not (
            rule.index_input and x.dim() < (self.index_ndim or 0))
        if x.grad_fn is None and not constant and batch_shaped and batch > 1 and x.shape[0] == 1:
            # made in the forward with a size-1 dim 0 that broadcasts over the batch (GPT-2's positions
            # arange(T)[None]): expanded to the batch, on probation (independence replay, separability probe)
            self.made_shared.append((path, x.detach()))
            self.made_inside[path] = (f"{where}: its input {shape}, made inside the model, broadcasts a size-1 dim 0 "
                                      f"over the batch of {batch}")
            return True
        if x.grad_fn is None and (constant or not batch_shaped or x.shape[0] != batch):
            if not constant:  # made in the forward (positions arange(T), or a detached batch statistic?)
                self.made_shared.append((path, x.detach()))
            return False  # a buffer, a frozen weight or a batch-free tensor: the same for every sample
        if x.grad_fn is not None:
            self.made_shared.append((path, x.detach()))
            return False  # computed with autograd from neither the input nor a hooked call: a constant
        # made in the forward with the batch size in dim 0 (positions arange(T).expand(B, T)): per sample on
        # probation, until the replay shows it independent of the samples and the separability probe that
        # row b reaches only sample b's loss
        self.made_shared.append((path, x.detach()))
        self.made_inside[path] = (f"{where}: its input {shape} is made inside the model (not derived from the "
                                  f"model's input) with the batch size {batch} in dim 0")
        return True

    def derived_from_batch(self, x: Tensor) -> bool:
        """Whether autograd derives ``x`` from the model's input or an earlier hooked call's output."""
        stack, seen = [x.grad_fn], set()
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            if node in self.sources:
                return True
            seen.add(node)
            var = getattr(node, "variable", None)
            if var is not None:
                if id(var) in self.root_leaves:
                    return True
                continue
            stack.extend(fn for fn, _ in node.next_functions)
        return False

    def constant_storages(self) -> set[int]:
        """Storages of the model's buffers and frozen parameters (the same for every sample)."""
        return {t.untyped_storage().data_ptr() for t in self.model.buffers() if t.numel()} | \
            {p.untyped_storage().data_ptr() for p in self.model.parameters() if not p.requires_grad and p.numel()}


# ---------------------------------------------------------------------------------------------
# Independence of shared inputs from the samples


class KeyedDraws:
    """The random choices of one perturbed replay (which samples, and how), read from keyed streams
    under ``SHAKE-256(key ‖ label ‖ index)`` (:func:`fedpriv.keys.randomness.keystream`), never from a
    seeded ``torch.Generator`` or torch's global RNG (neither is touched): without ``key`` a model
    cannot predict which rows are perturbed, nor the values. ``key`` (32 bytes) is the engine's,
    ``label`` names the check, ``index`` counts the engine's draws (no two share a stream).

    * :meth:`chosen`: each sample with probability ½ (the top bit of a 64-bit word), then one
      kept or perturbed sample flipped where all, or none, were chosen;
    * :meth:`normal`: standard normals (the ChaCha20 Gaussian keystream of
      :class:`~fedpriv.keys.keystream.GaussianKeystream`, float32, cast to the tensor's dtype);
    * :meth:`indices`: uniform in ``[0, high)`` (a 64-bit word mod ``high``: bias below ``high/2⁶⁴``).

    Each call reads on in its own stream, so the draws depend only on the key, the index and the
    sequence of calls (the same research key replays them).
    """

    def __init__(self, key: bytes, label: str, index: int) -> None:
        self._key = keystream(key, label, (index,), KEY_BYTES)
        self._normals = GaussianKeystream(keystream(self._key, "normal", (), KEY_BYTES))
        self._words = 0  # word draws so far (:meth:`_uint64s`)

    def _uint64s(self, n: int) -> np.ndarray:
        self._words += 1
        return uint64s(self._key, "words", (self._words,), n)

    def chosen(self, batch: int) -> Tensor:
        """Which samples a replay perturbs, [batch] bool: each with probability ½, at least one
        perturbed and one kept where ``batch > 1`` (a batch of one has nothing to compare: never
        replayed)."""
        words = self._uint64s(batch + 2)
        chosen = torch.from_numpy((words[:batch] >> np.uint64(63)).astype(bool))
        flip = (words[batch:] % np.uint64(batch)).astype(np.int64)
        if not chosen.any():
            chosen[int(flip[0])] = True
        if chosen.all() and batch > 1:
            chosen[int(flip[1])] = False
        return chosen

    def normal(self, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
        """Standard normals of ``shape`` in ``dtype`` (host)."""
        return self._normals.normal(tuple(shape), dtype)

    def indices(self, high: int, shape: Sequence[int]) -> Tensor:
        """Uniform integers in ``[0, high)`` of ``shape`` (int64, host)."""
        n = math.prod(shape)
        words = self._uint64s(n) % np.uint64(high)
        return torch.from_numpy(words.astype(np.int64)).view(tuple(shape))


def perturbed(value: Any, draws: KeyedDraws, rows: Optional[Tensor] = None) -> Any:
    """Another valid input of the same shape: an integer (or bool, or complex) tensor's entries
    resampled from its own values (indices stay in range; where that changed nothing, its values
    rolled by one along the last dim), a float tensor plus unit noise in its dtype; other arguments
    unchanged. ``rows`` (int64 indices into dim 0): only those rows are drawn and replaced, the
    others kept bit for bit (an integer tensor's rows still draw from all its values)."""
    if not isinstance(value, Tensor) or value.dim() == 0 or value.numel() == 0:
        return value
    value = value.detach()
    where = None if rows is None else rows.to(value.device)
    part = value if where is None else value.index_select(0, where)
    if value.is_floating_point():
        new = part + draws.normal(part.shape, value.dtype).to(value.device)
    else:
        flat = value.reshape(-1)
        new = flat[draws.indices(flat.numel(), part.shape).to(value.device)]
        if torch.equal(new, part) and flat.numel() > 1:
            rolled = value.roll(1, dims=-1)
            new = rolled if where is None else rolled.index_select(0, where)
    return new if where is None else value.index_copy(0, where, new)


def check_data_independent(made: Sequence[tuple[str, Tensor]], replayed: dict[str, list[Tensor]],
                           modules: dict[str, nn.Module]) -> None:
    """Fail if a shared call's input (no batch dim, made in the forward) changes when the model's
    input does: it is then computed from the samples without autograd (a detached batch statistic,
    say), so one sample's data would reach every sample's clipped gradient and the sum's
    sensitivity would not be the clip bound. ``replayed``: the inputs of the same calls, in order,
    in a forward on :func:`perturbed` arguments."""
    seen: dict[str, int] = {}
    for path, original in made:
        k = seen.get(path, 0)
        seen[path] = k + 1
        again = replayed.get(path, [])
        if k >= len(again) or again[k].shape != original.shape or not torch.equal(again[k], original):
            raise UnsupportedLayerError(
                f"{path} ({type(modules[path]).__name__}): its input {tuple(original.shape)} is made in the forward "
                "with no autograd link to the model's input, but changes when that input does: it is computed from "
                "the samples without autograd (a detached batch statistic, a mask), so which samples each of its "
                "rows holds cannot be proven; compute it with autograd from the model's input, or from constants "
                "only")


# ---------------------------------------------------------------------------------------------
# Separability of the loss


def ambiguous_batch_dim(calls: Sequence[RecordedCall], batch: int) -> bool:
    """Whether some hooked input has the batch size in a dim other than 0 (where a transpose of the
    batch with that dim would keep every shape)."""
    return any(batch in tuple(c.input.shape[1:]) for c in calls)


PROBE_EXPONENTS = 30  # probe weights ±2^k, |k| <= PROBE_EXPONENTS: 2 · 61 = 122 distinct values


def probe_weights(batch: int, generator: torch.Generator) -> Tensor:
    """The separability probe's weights [batch] (float64; exact in any float dtype): each ``±2^k``,
    ``k`` an integer in ``[-PROBE_EXPONENTS, PROBE_EXPONENTS]``, drawn as consecutive random
    permutations of those 122 values (``generator``), so that the samples of a batch of up to 122
    all have distinct weights and two others share one with probability 1/122 (2^±30 keeps a float32
    loss of 1e6 and a gradient of 1e-20 far from overflow and underflow).

    Why powers of two: multiplying by ``2^k`` or negating is exact in IEEE arithmetic (short of
    overflow or underflow), and a backward is linear in its upstream gradient, so a separable
    model's weighted backward computes ``w_i`` times the unweighted one *bit for bit*, rounding
    included. With a non-dyadic weight the two backwards round differently, which shows where a
    gradient is a cancellation: a query attending to one key has an output gradient that is zero in
    exact arithmetic and float32 rounding noise as computed (``P·(dP - rowsum(dO∘O))``, softmax
    backward), which no weight scales, and it exceeded the tolerance in sound models. Where row i
    depends on sample j ≠ i, its weighted gradient differs from ``w_i`` times the unweighted one by
    ``(w_j - w_i)·∂ℓ_j/∂y[i]``, and ``|w_j/w_i - 1| ≥ 1/2`` for distinct weights."""
    values = torch.tensor([sign * 2.0 ** k for k in range(-PROBE_EXPONENTS, PROBE_EXPONENTS + 1)
                           for sign in (1.0, -1.0)], dtype=torch.float64)
    rounds = -(-batch // len(values))
    order = torch.cat([torch.randperm(len(values), generator=generator) for _ in range(rounds)])
    return values[order[:batch]]


def separability_probe(loss: Tensor, calls: Sequence[RecordedCall]
                       ) -> tuple[Tensor, list[Optional[tuple[Tensor, Tensor]]]]:
    """The weighted backward of :func:`check_separable` (weights: :func:`probe_weights`), run first
    (graph retained) and kept only as per-row fingerprints (with the projection directions, reused
    for the unweighted gradient), so the check holds at most one set of output gradients."""
    weights = probe_weights(loss.shape[0], torch.Generator().manual_seed(0x5EED)).to(loss.dtype).to(loss.device)
    probe = list(torch.autograd.grad((loss * weights).sum(), [c.edge for c in calls], allow_unused=True,
                                     retain_graph=True))
    prints: list[Optional[tuple[Tensor, Tensor]]] = []
    for k in range(len(probe)):
        g, probe[k] = probe[k], None  # each gradient freed once fingerprinted
        if g is None:
            prints.append(None)
        else:
            directions = _directions(g)
            prints.append((_fingerprint(g, directions), directions))
    return weights, prints


def check_separable(calls: Sequence[RecordedCall], grads: Sequence[Optional[Tensor]], weights: Tensor,
                    probe: list[Optional[tuple[Tensor, Tensor]]], notes: Optional[dict[str, str]] = None) -> None:
    """Fail if any sample's loss depends on another sample's row of a hooked call's output.

    Per-sample clipping attributes row i of every call to sample i, which holds iff
    ∂ℓ_j/∂y[i] = 0 for j ≠ i. Then for any weights w, ∂(Σ_j w_j ℓ_j)/∂y[i] = w_i ∂(Σ_j ℓ_j)/∂y[i]
    row by row; with random w, any dependence across samples (a transpose of the batch, a
    cumulative sum or mean over it) breaks that equality. ``grads`` are the unweighted output
    gradients, ``weights`` and ``probe`` what :func:`separability_probe` returned: one extra
    backward, which the engine runs on its first backward and whenever a layer input has the batch
    size in another dim too (:func:`ambiguous_batch_dim`). Rows are compared
    through :func:`_fingerprint` (squared norm and random projections, linear in the row up to
    the norm), the weighted ones divided by their weights (exact: :func:`probe_weights`), so that
    the tolerance (1e-3 relative, per statistic over the rows) is in the unweighted gradient's units
    whatever the spread of the weights; a separable model's weighted rows are then the unweighted
    ones bit for bit (a reproducible backward), and a dependence smaller than the tolerance goes
    unnoticed."""
    for call, full, weighted in zip(calls, grads, probe):
        if full is None and weighted is None:
            continue
        if full is None or weighted is None:
            mismatch = True
        else:
            weighted, directions = weighted
            w = (weights if call.rows is None else weights[call.rows]).to(weighted)  # a flattened position's sample's
            unweighted = weighted.clone()  # in the unweighted gradient's units (dividing by ±2^k: exact)
            unweighted[:, 0] /= w * w  # squared norms scale by w²
            unweighted[:, 1:] /= w.unsqueeze(1)
            expected = _fingerprint(full, directions)
            scale = expected.norm(dim=0) + unweighted.norm(dim=0)  # per statistic, over the rows
            mismatch = bool(((unweighted - expected).norm(dim=0) > 1e-3 * scale + 1e-12).any())
        if mismatch and notes and call.path in notes:  # a call on a tensor made inside the model
            raise UnsupportedLayerError(
                f"{notes[call.path]}, and the separability probe found that a sample's loss depends on other "
                "samples' rows of this layer's output, so its rows are not per sample; give the model such a "
                "tensor as an input (batch-first), or make it without a batch dim")
        if mismatch:
            raise UnsupportedLayerError(
                f"{call.path} ({type(call.module).__name__}): a sample's loss depends on other samples' rows of "
                "this layer's output, so dim 0 of its input is not the batch (transposed, reshaped or mixed "
                "across samples); per-sample clipping needs the batch in dim 0 and no mixing of samples")


def _directions(g: Tensor, projections: int = 3) -> Tensor:
    """``projections`` random directions (fixed seed) in the row space of ``g`` [B, ...]."""
    return torch.randn(math.prod(g.shape[1:]), projections, generator=torch.Generator().manual_seed(0xF1A9),
                       dtype=g.dtype).to(g.device)


def _fingerprint(g: Tensor, directions: Tensor) -> Tensor:
    """Per row of ``g`` [B, ...]: its squared norm and its projections on ``directions`` (the same
    for both gradients of one call), [B, 1 + projections], float64."""
    rows = g.reshape(g.shape[0], math.prod(g.shape[1:]))
    squares = torch.linalg.vector_norm(rows, dim=1, keepdim=True).pow(2)  # no [B, N] temporary
    return torch.cat([squares, rows @ directions], 1).double()


# ---------------------------------------------------------------------------------------------
# Forward replay: no row of a hooked call depends on another sample


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: Tensor) -> Tensor:
    """``t``'s bits as integers of its width (a view), so that equality is bit equality (NaN too)."""
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(_BITS[t.element_size()]) if t.is_floating_point() else t


@dataclass
class CallPrint:
    """What the forward replay compares of one hooked call: ``kind`` "rows" (dim 0 the batch),
    "positions" (flattened positions; ``samples`` the sample of each row) or "whole" (a shared
    input, or one broadcast over the batch: every sample's); its input (the tensor the engine keeps
    anyway, which the model must not modify in place) and, where compared, a copy of its output."""

    path: str
    kind: str
    input: Tensor
    output: Optional[Tensor]
    samples: Optional[Tensor] = None


def call_print(path: str, kind: str, x: Tensor, output: Optional[Tensor], samples: Optional[Tensor] = None,
               copy: bool = True) -> CallPrint:
    """The :class:`CallPrint` of a call on ``x`` giving ``output`` (``None``: output not compared;
    ``copy``: keep a copy of it, as a later in-place change of the output is allowed)."""
    if output is not None:
        output = output.detach().clone() if copy else output.detach()
    return CallPrint(path, kind, x.detach(), output, samples)


def map_tensors(value: Any, fn: Callable[[Tensor], Any]) -> Any:
    """``value`` with ``fn`` applied to every tensor in it: itself, or inside its tuples (named ones
    too), lists, mappings (dicts, HF ``ModelOutput``) and dataclass instances, at any depth, each
    container rebuilt as a new one of its type (the caller's is never changed; an immutable mapping
    that cannot be rebuilt so becomes a dict); anything else is returned as it is, unvisited."""
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        items = [map_tensors(v, fn) for v in value]
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
            return type(value)(*items)
        return type(value)(items) if type(value) in (tuple, list) else _rebuilt(value, items)
    if isinstance(value, Mapping):
        mapped = {key: map_tensors(value[key], fn) for key in list(value.keys())}
        if isinstance(value, MutableMapping):
            new = copy.copy(value)
            for key, item in mapped.items():
                new[key] = item
            return new
        try:
            return type(value)(mapped)
        except TypeError:
            return mapped
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        new = copy.copy(value)
        for f in dataclasses.fields(value):
            if hasattr(value, f.name):
                object.__setattr__(new, f.name, map_tensors(getattr(value, f.name), fn))  # (frozen ones too)
        return new
    return value


def _rebuilt(value: Any, items: list) -> Any:
    """A tuple or list subclass rebuilt with ``items`` (its plain base where its constructor differs)."""
    try:
        return type(value)(items)
    except TypeError:
        return (tuple if isinstance(value, tuple) else list)(items)


def perturb_samples(value: Any, chosen: Tensor, draws: KeyedDraws) -> Any:
    """A model argument with the rows of the ``chosen`` samples replaced as :func:`perturbed`
    would in every tensor whose dim 0 is the batch, whether the argument itself or inside its tuples,
    lists and dicts (:func:`map_tensors`); other rows and tensors unchanged. The argument itself, a
    float tensor, is returned as a leaf that requires grad (as the engine traces the model's float
    inputs); a tensor inside a container keeps whether it required grad."""
    rows = torch.nonzero(chosen)[:, 0]
    if isinstance(value, Tensor):
        if value.dim() == 0:
            return value
        value = _perturb_rows(value, rows, chosen.shape[0], draws)
        return value.requires_grad_(True) if value.is_floating_point() else value
    return map_tensors(value, lambda t: _perturb_rows(t, rows, chosen.shape[0], draws).requires_grad_(
        t.requires_grad and (t.is_floating_point() or t.is_complex())))


def _perturb_rows(value: Tensor, rows: Tensor, batch: int, draws: KeyedDraws) -> Tensor:
    """``value`` (detached) with rows ``rows`` :func:`perturbed` where its dim 0 is the batch."""
    if value.dim() == 0 or value.shape[0] != batch or not value.numel():
        return value.detach()
    return perturbed(value, draws, rows)


def _kept_runs(chosen: Tensor) -> list[tuple[int, int]]:
    """The samples not ``chosen``, as ranges ``[start, stop)`` of consecutive rows."""
    runs: list[tuple[int, int]] = []
    for i in torch.nonzero(~chosen.cpu())[:, 0].tolist():
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def _rows_differ(p: CallPrint, q: CallPrint, a: Tensor, b: Tensor, chosen: Tensor) -> bool:
    """Whether ``a`` (of ``p``) and ``b`` (of ``q``, the replay) differ in a bit of a row of a
    sample not ``chosen`` (for "whole", anywhere). On the host, rows of kept samples are compared run
    by run of consecutive samples (``torch.equal`` on their bits: no temporary the size of the input,
    the perturbed rows never read); on a device, all rows at once (one synchronisation)."""
    if p.kind == "whole":
        return a.shape != b.shape or not torch.equal(_bits(a), _bits(b))
    if p.kind == "rows":
        if a.shape != b.shape:
            return True
        a, b = _bits(a), _bits(b)
        if a.device.type == "cpu":
            return not all(torch.equal(a[start:stop], b[start:stop]) for start, stop in _kept_runs(chosen))
        changed = (a != b).reshape(a.shape[0], -1).any(1)
        return bool(changed[~chosen.to(changed.device)].any())
    keep_a, keep_b = ~chosen.to(a.device)[p.samples], ~chosen.to(b.device)[q.samples]
    a, b = a[keep_a], b[keep_b]
    return a.shape != b.shape or not torch.equal(_bits(a), _bits(b))


def replay_mismatch(original: CallPrint, again: CallPrint, chosen: Tensor) -> Optional[str]:
    """What of ``original`` changed in the replay ``again`` where it must not (rows of samples not
    ``chosen``; for "whole", everything), or None."""
    if again.kind != original.kind or again.input.shape[1:] != original.input.shape[1:]:
        return f"its input's shape changed from {tuple(original.input.shape)} to {tuple(again.input.shape)}"
    for what in ("input", "output"):
        a, b = getattr(original, what), getattr(again, what)
        if a is not None and b is not None and _rows_differ(original, again, a, b, chosen):
            return (f"its {what} changed" if original.kind == "whole"
                    else f"its {what} rows of the samples left unchanged changed")
    return None


def _tensors(value: Any) -> list[Tensor]:
    """The tensors in ``value``, in order, found as :func:`map_tensors` finds them (the perturbation's walk)."""
    found: list[Tensor] = []
    map_tensors(value, lambda t: found.append(t) or t)
    return found


def rows_within(t: Any, base: Tensor) -> bool:
    """Whether ``t`` is ``base`` or a view of it whose row i holds only elements of ``base``'s row
    i (e.g. ``base[..., :V]``): ``base`` contiguous (row i is one contiguous range of its storage),
    ``t`` on the same storage with the same dim 0 and row stride, each row's span inside that range."""
    if t is base:
        return True
    if not (isinstance(t, Tensor) and t.dim() and base.dim() and base.is_contiguous() and t.numel()
            and t.dtype == base.dtype and t.device == base.device and t.shape[0] == base.shape[0]
            and t.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()):
        return False
    if base.shape[0] > 1 and t.stride(0) != base.stride(0) or any(s < 0 for s in t.stride()):
        return False
    start = t.storage_offset() - base.storage_offset()
    span = sum((n - 1) * s for n, s in zip(t.shape[1:], t.stride()[1:]))
    return 0 <= start and start + span < math.prod(base.shape[1:])


def output_prints(output: Any, batch: int, flat: Sequence[Tensor], copy: bool = True) -> list[CallPrint]:
    """What the forward replay compares of the model's return value, the tensor(s) the per-sample
    loss is computed from: each tensor in it (:func:`_tensors`), as "positions" if its dim 0 has as
    many rows as a :func:`flat_positions` of that forward made (``flat``: each one's rows' samples;
    the last such), as "rows" if its dim 0 is the ``batch``, else "whole" (e.g. a statistic over the
    batch); copied (``copy``), as the caller may change it in place before the backward."""
    prints = []
    counts = {int(rows.shape[0]): rows for rows in flat}
    for t in _tensors(output):
        samples = counts.get(int(t.shape[0])) if t.dim() else None
        kind = "positions" if samples is not None else "rows" if t.dim() and t.shape[0] == batch else "whole"
        prints.append(call_print("the model's output", kind, t, None, samples, copy=False))
        if copy:
            prints[-1].input = prints[-1].input.clone()
    return prints


_PROJECTED = 1 << 22  # elements of a tensor that value_print widens to its projection dtype at once


def value_print(t: Tensor, direction: Optional[Tensor]) -> tuple[Tensor, Optional[Tensor]]:
    """What shows whether ``t``'s values changed between two moments, by value (an autograd version
    counter misses a write through ``.data`` or numpy): per row of dim 0, the wrapping integer sum of its
    elements' bits, which any one changed element changes, as does moving a row to another; and for a
    float tensor the projection of each of its last-dim rows on ``direction`` (a secret random vector of
    that length), which a change of several elements that keeps those sums (a permutation within a
    row, say) moves. The projection is computed in float32 at least (a bfloat16 or float16 tensor is
    widened exactly, in chunks of rows): in the tensor's own 8- or 11-bit mantissa a change that keeps a
    row's bit sum was lost to rounding often (one logit doubled, another halved: 31 in 200 rows of 1000
    bfloat16 logits). Two passes over ``t``; compare with :func:`same_values`."""
    t = t.detach()
    bits = _bits(t).reshape(t.shape[0] if t.dim() else 1, -1)  # (a non-contiguous tensor is copied)
    sums = bits.sum(1, dtype=torch.int64 if bits.element_size() == 8 else torch.int32)  # modular: in any order
    if direction is None or not t.dim() or not t.shape[-1]:
        return sums, None
    rows = t.reshape(-1, t.shape[-1])
    wide = torch.promote_types(t.dtype, torch.float32)
    direction = direction.to(wide)
    if rows.dtype == wide:
        return sums, rows @ direction
    step = max(1, _PROJECTED // rows.shape[1])
    return sums, torch.cat([rows[i:i + step].to(wide) @ direction for i in range(0, rows.shape[0], step)])


def same_values(a: tuple[Tensor, Optional[Tensor]], b: tuple[Tensor, Optional[Tensor]]) -> bool:
    """Whether two :func:`value_print` of one tensor agree in every bit."""
    if not torch.equal(a[0], b[0]) or (a[1] is None) != (b[1] is None):
        return False
    return a[1] is None or (a[1].shape == b[1].shape and torch.equal(_bits(a[1]), _bits(b[1])))


_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


def _plain(value: Any) -> bool:
    """A value whose ``repr`` is its meaning (a number, a string, a dtype, tuples and lists of them)."""
    return isinstance(value, _PLAIN) or (isinstance(value, (tuple, list)) and all(_plain(v) for v in value))


def state_print(module: nn.Module, direction: Callable[[Tensor], Optional[Tensor]]) -> list[tuple[str, str, Any]]:
    """What a registered layer's forward computes its output from besides its input, as it is now: each
    parameter's and buffer's :func:`value_print` (``direction``: the secret direction for a tensor), and
    each public attribute (a tensor by its value_print, a number, string or tuple of them by its ``repr``,
    anything else by identity). Compare two with :func:`same_state`."""
    out: list[tuple[str, str, Any]] = []
    for name, t in (*module._parameters.items(), *module._buffers.items()):
        out.append((name, "tensor", None if t is None else value_print(t, direction(t))))
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        if isinstance(value, Tensor):
            out.append((name, "tensor", value_print(value, direction(value))))
        else:
            out.append((name, "repr", repr(value)) if _plain(value) else (name, "object", value))
    return out


def same_state(a: Sequence[tuple[str, str, Any]], b: Sequence[tuple[str, str, Any]]) -> bool:
    """Whether two :func:`state_print` of one module agree (the same names, every tensor's value print in
    every bit, every plain value's repr, every other attribute the same object)."""
    if [(name, kind) for name, kind, _ in a] != [(name, kind) for name, kind, _ in b]:
        return False
    for (_, kind, u), (_, _, v) in zip(a, b):
        if kind == "tensor" and not ((u is None and v is None) or (u is not None and v is not None
                                                                    and same_values(u, v))):
            return False
        if (kind == "repr" and u != v) or (kind == "object" and u is not v):
            return False
    return True


def output_mismatch(original: Sequence[CallPrint], again: Sequence[CallPrint], chosen: Tensor) -> Optional[str]:
    """What of the model's return value (:func:`output_prints`) changed in the replay where it
    must not (rows of samples not ``chosen``; a "whole" tensor anywhere), or None."""
    if [p.kind for p in original] != [q.kind for q in again]:
        return "its tensors changed in number or layout"
    for p, q in zip(original, again):
        if _rows_differ(p, q, p.input, q.input, chosen):
            return "it changed" if p.kind == "whole" else "its rows of the samples left unchanged changed"
    return None


def replay_error(path: str, module: nn.Module, chosen: Tensor, what: str) -> UnsupportedLayerError:
    """The refusal of a forward replay that found ``what`` at call ``path``."""
    samples = ", ".join(str(int(i)) for i in torch.nonzero(chosen)[:, 0][:8]) + (", ..." if chosen.sum() > 8 else "")
    return UnsupportedLayerError(
        f"{path} ({type(module).__name__}): in a forward replay with sample(s) {samples} of the batch perturbed, "
        f"{what}, so the model mixes samples in its forward (a batch mean or other statistic over dim 0, "
        "detached or not, batch centring, an op across the batch); per-sample clipping would then not bound "
        "one sample's influence on the sum; compute each row from its own sample only")
