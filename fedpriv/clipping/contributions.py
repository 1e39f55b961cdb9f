"""Factored per-sample gradients of one parameter, and the algebra BK needs on them.

A layer rule (see :mod:`fedpriv.clipping.rules`) turns one module call into *contributions*: for
each parameter, a description of every sample's gradient ``G_i`` in one of three forms.

* :class:`Outer` — ``G_i = Σ_t left[i,t] ⊗ right[i,t]`` (reshaped to the parameter): a Linear or
  (unfolded) Conv weight; ``left`` are output gradients, ``right`` kept input activations.
* :class:`Rows` — ``G_i = Σ_t e_{index[i,t]} ⊗ values[i,t]``: an Embedding table; row
  ``index[i,t]`` receives ``values[i,t]`` (the output gradient).
* :class:`Dense` — ``G_i`` given explicitly, ``per_sample[i]`` (biases, LayerNorm).

The first two never need ``G_i`` itself: ``<G_i, H_i>`` for two factored forms is a double sum
over positions (:func:`cross`), the "ghost norm" of Li et al. / Bu et al.; :func:`per_sample`
instantiates ``G_i`` where that is cheaper, and :func:`weighted_sum` forms ``Σ_i c_i G_i``
straight from the factors (book-keeping). Every tensor is batch-first: dim 0 indexes the clipping
unit (a sample, or a group after :func:`regroup`); dim 1 of ``Outer``/``Rows`` is positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import torch
from torch import Tensor


@dataclass(frozen=True)
class Outer:
    """``G_i = Σ_t left[i,t] right[i,t]ᵀ``; ``left`` [B,T,p], ``right`` [B,T,d], param numel p·d."""

    left: Tensor
    right: Tensor

    @property
    def steps(self) -> int:
        return self.left.shape[1]


@dataclass(frozen=True)
class Rows:
    """``G_i = Σ_t e_{index[i,t]} values[i,t]ᵀ`` ([num_rows, d]); ``index`` [B,T], ``values`` [B,T,d]."""

    index: Tensor
    values: Tensor
    num_rows: int

    @property
    def steps(self) -> int:
        return self.index.shape[1]


@dataclass(frozen=True)
class Dense:
    """``G_i = per_sample[i]``; ``per_sample`` [B, *param.shape]."""

    per_sample: Tensor


Contribution = Union[Outer, Rows, Dense]


def concat(parts: Sequence[Contribution]) -> Contribution:
    """One contribution equal to the sum of ``parts`` (all of the same kind).

    Factored forms are concatenated along positions (``Σ_t`` over the union of positions), so
    several calls of one layer, or two layers sharing a weight in the same form, become one.
    """
    first = parts[0]
    if len(parts) == 1:
        return first
    if isinstance(first, Outer):
        return Outer(torch.cat([c.left for c in parts], 1), torch.cat([c.right for c in parts], 1))
    if isinstance(first, Rows):
        return Rows(torch.cat([c.index for c in parts], 1), torch.cat([c.values for c in parts], 1),
                    first.num_rows)
    total = first.per_sample.clone()
    for c in parts[1:]:
        total += c.per_sample
    return Dense(total)


# ----------------------------------------------------------------------------- grouping


@dataclass(frozen=True)
class Grouping:
    """Maps samples to clipping units (the distinct group ids in increasing order).

    ``unit[i]`` is sample i's unit. ``buckets`` gathers units of equal size so they can be
    handled as one batch without padding: each is ``(units [k], members [k, size])``, row j of
    ``members`` holding the sample indices of unit ``units[j]``.
    """

    unit: Tensor
    num_units: int
    buckets: tuple[tuple[Tensor, Tensor], ...]

    @staticmethod
    def from_ids(ids: Tensor) -> "Grouping":
        """Build from one group id per sample (any integers)."""
        _, unit = torch.unique(ids, sorted=True, return_inverse=True)
        return Grouping.from_units(unit, int(unit.max()) + 1 if unit.numel() else 0)

    @staticmethod
    def from_units(unit: Tensor, num_units: int) -> "Grouping":
        """Build from each sample's unit index in ``[0, num_units)`` (a unit may have no sample:
        it is in no bucket and gets nothing from this grouping)."""
        counts = torch.bincount(unit, minlength=num_units)
        order = torch.argsort(unit, stable=True)  # samples of unit 0, then unit 1, ...
        starts = torch.cumsum(counts, 0) - counts
        buckets = []
        for size in torch.unique(counts).tolist():
            if size == 0:
                continue
            units = torch.nonzero(counts == size).flatten()
            members = order[starts[units].unsqueeze(1) + torch.arange(size, device=order.device)]
            buckets.append((units, members))
        return Grouping(unit, num_units, tuple(buckets))


def bucket_view(c: Contribution, members: Tensor) -> Contribution:
    """The contribution of k equal-size units (``members`` [k, size]) as a batch of k: each
    unit's samples' positions laid end to end, so ``G_u = Σ_{i in u} G_i`` with no padding."""
    k = members.shape[0]
    flat = members.reshape(-1)
    start = int(flat[0]) if flat.numel() else 0
    if flat.numel() and torch.equal(flat, torch.arange(start, start + flat.numel(), device=flat.device)):
        members = slice(start, start + flat.numel())  # consecutive samples: views, no gather copy
    if isinstance(c, Outer):
        return Outer(c.left[members].reshape(k, -1, c.left.shape[2]),
                     c.right[members].reshape(k, -1, c.right.shape[2]))
    if isinstance(c, Rows):
        return Rows(c.index[members].reshape(k, -1), c.values[members].reshape(k, -1, c.values.shape[2]),
                    c.num_rows)
    return Dense(c.per_sample[members].reshape((k, -1) + tuple(c.per_sample.shape[1:])).sum(1))


# ----------------------------------------------------------------------------- algebra


def per_sample(c: Contribution, shape: torch.Size) -> Tensor:
    """Instantiate ``G`` as [B, *shape] (cost B·T·p·d for Outer; memory B·numel)."""
    if isinstance(c, Dense):
        return c.per_sample.reshape((-1,) + tuple(shape))
    if isinstance(c, Outer):
        return torch.bmm(c.left.transpose(1, 2), c.right).reshape((-1,) + tuple(shape))
    b, t, d = c.values.shape
    offsets = torch.arange(b, device=c.index.device).unsqueeze(1) * c.num_rows
    flat = _scatter_rows(c.index + offsets, c.values, b * c.num_rows)
    return flat.reshape((b,) + tuple(shape))


def _scatter_rows(index: Tensor, values: Tensor, num_rows: int) -> Tensor:
    """``out[k] = Σ_{j: index_j = k} values_j`` ([num_rows, d]) with the kernel nn.Embedding's
    own backward uses (sort-based; much faster on CPU than ``index_add_`` with repeated rows)."""
    d = values.shape[-1]
    return torch.ops.aten.embedding_dense_backward(values.reshape(-1, d), index.reshape(-1),
                                                   num_rows, -1, False)


def cross(x: Contribution, y: Contribution) -> Tensor:
    """``<G_i, H_i>`` for every unit i, [B], for factored forms — no per-sample gradient formed.

    Outer·Outer: ``Σ_{t,s} (l_t·l'_s)(r_t·r'_s)`` (``l lᵀ`` and ``r rᵀ`` are [B,T,T'] products).
    Rows·Rows:   ``Σ_{t,s} [k_t = k'_s] (v_t·v'_s)``.
    Rows·Outer:  ``Σ_{t,s} l'_s[k_t] (v_t·r'_s)`` (a tied embedding table and output layer).
    """
    if isinstance(x, Outer) and isinstance(y, Rows):
        x, y = y, x
    if isinstance(x, Outer) and isinstance(y, Outer):
        if x.steps == 1 and y.steps == 1:
            return (x.left * y.left).sum((1, 2)) * (x.right * y.right).sum((1, 2))
        lefts = torch.bmm(x.left, y.left.transpose(1, 2))
        rights = torch.bmm(x.right, y.right.transpose(1, 2))
        return (lefts * rights).sum((1, 2))
    if isinstance(x, Rows) and isinstance(y, Rows):
        same = x.index.unsqueeze(2) == y.index.unsqueeze(1)
        dots = torch.bmm(x.values, y.values.transpose(1, 2))
        return (dots * same).sum((1, 2))
    if isinstance(x, Rows) and isinstance(y, Outer):
        b, t = x.index.shape
        picked = y.left.gather(2, x.index.unsqueeze(1).expand(b, y.steps, t))  # [B, S, T]
        dots = torch.bmm(y.right, x.values.transpose(1, 2))  # [B, S, T]
        return (picked * dots).sum((1, 2))
    raise TypeError(f"no ghost inner product between {type(x).__name__} and {type(y).__name__}")


def weighted_sum(c: Contribution, coef: Tensor, shape: torch.Size, out: Tensor | None = None) -> Tensor:
    """``Σ_i coef[i] G_i`` as a tensor of ``shape``, straight from the factors (book-keeping).

    With ``out`` (of ``shape``) the sum is added to it in place and ``out`` returned: a second
    part of one parameter (a tied embedding's rows after its output layer's outer products)
    accumulates into the first without a full-size temporary (``Rows`` then touch only the rows
    they index, with ``index_add_``, instead of scattering into a zeroed table).
    """
    if isinstance(c, Dense):
        term = torch.tensordot(coef, c.per_sample, dims=1).reshape(shape)
        return term if out is None else out.add_(term)
    if isinstance(c, Outer):
        left, right = c.left, c.right
        scale = coef.view(-1, 1, 1)
        if left.shape[2] <= right.shape[2]:  # scale the smaller factor
            left = left * scale
        else:
            right = right * scale
        if left.is_contiguous():
            flat_left = left.view(-1, left.shape[2])
            flat_right = right.reshape(-1, right.shape[2])
            if out is None:
                return torch.mm(flat_left.t(), flat_right).reshape(shape)
            out.view(flat_left.shape[1], flat_right.shape[1]).addmm_(flat_left.t(), flat_right)
            return out
        # e.g. the logits' gradient when the loss took logits.transpose(1, 2): stored [B, p, T];
        # a per-sample GEMM accumulated in place avoids a transposing copy of it
        if out is None:
            acc = left.new_empty(left.shape[2], right.shape[2])
            return torch.addbmm(acc, left.transpose(1, 2), right, beta=0).reshape(shape)
        out.view(left.shape[2], right.shape[2]).addbmm_(left.transpose(1, 2), right)
        return out
    values = c.values * coef.view(-1, 1, 1)
    if out is None:
        return _scatter_rows(c.index, values, c.num_rows).reshape(shape)
    d = values.shape[-1]
    out.view(c.num_rows, d).index_add_(0, c.index.reshape(-1), values.reshape(-1, d))
    return out
