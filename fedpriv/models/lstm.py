"""LSTM built from ``nn.Linear`` pieces, and the StackOverflow LSTM language model.

Gate order (input, forget, cell, output) and the equations match ``torch.nn.LSTM``::

    [i, f, g, o] = W_ih x_t + b + W_hh h_{t-1}
    c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(g),   h_t = σ(o) ⊙ tanh(c_t)

One bias vector (as Keras/TFF); ``nn.LSTM``'s two biases are equivalent to their sum. Because
both weight matrices are ``nn.Linear`` modules, per-sample clipping hooks see every weight.

Three forwards compute the same function:

* *fused* (the default): PyTorch's LSTM kernel on the very same parameters.
* *per-sample* (``per_sample=True``, set by the clipping ``prepare`` step): the form per-sample
  clipping needs at almost the fused kernel's cost. ``ih`` is one hooked call over all time steps;
  the recurrence runs without autograd (no per-step graph, no per-step hooks); ``hh`` is then one
  hooked call on the stored states ``h_0..h_{T-2}``; :class:`_Recurrence` joins the two gate
  products and back-propagates through time itself, so the gradient it hands both Linear calls is
  the total ``∂L/∂gates_t`` (recurrent path included). Per-sample norms and the clipped sum then
  come from two batched outer-product contributions (``Σ_t δ_t x_tᵀ`` and ``Σ_t δ_t h_{t-1}ᵀ``).
* *unrolled* (``unrolled=True``): step by step through the Linear gates with autograd (the
  reference, and the per-sample form when an initial state is passed).
* *lockstep* (``unrolled=True, lockstep=True``, set by :func:`fedpriv.models.vmappable` for
  cohort-parallel training): the same steps in :class:`_VmappableRecurrence`, whose own BPTT forms
  ``W_hh``'s gradient in one GEMM over all steps; ``vmap`` batches it over stacked parameters.

Importing this module registers :class:`LSTM` with :mod:`fedpriv.clipping`: a rule with no
parameters of its own (``ih``/``hh`` are clipped by the ``nn.Linear`` rule) whose ``prepare``
step sets ``per_sample=True`` while an engine is attached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
from torch import nn

from fedpriv.clipping import (LayerRule, computed_from, flat_positions, no_contributions, record_call,
                              register_hint, register_rule)
from fedpriv.precision import as_fp32
from fedpriv.schema import ModelOption, positive, register_option


class LSTM(nn.Module):
    """Drop-in for ``nn.LSTM(input_size, hidden_size, num_layers=1, batch_first=True)``.

    Arguments in ``nn.LSTM``'s order. ``num_layers`` and ``batch_first`` accept only the values
    above (one layer; input ``[B, T, input_size]``); any other value raises ``ValueError``.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = True) -> None:
        super().__init__()
        if isinstance(num_layers, bool) or num_layers != 1:
            raise ValueError(f"fedpriv.models.LSTM supports only num_layers=1, got num_layers={num_layers!r}; "
                             "stack several LSTM modules for a deeper network")
        if batch_first is not True:
            raise ValueError(f"fedpriv.models.LSTM supports only batch_first=True (input [B, T, input_size]), "
                             f"got batch_first={batch_first!r}; transpose the input to batch-first")
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = 1
        self.batch_first = True
        self.ih = nn.Linear(input_size, 4 * hidden_size, bias=bias)
        self.hh = nn.Linear(hidden_size, 4 * hidden_size, bias=False)
        self.unrolled = False  # step by step through the Linear gates, with autograd
        self.per_sample = False  # batched gate products + _Recurrence (set by the clipping prepare step)
        self.lockstep = False  # with unrolled: _VmappableRecurrence's own BPTT (set by models.vmappable)

    def forward(self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``x``: [B, T, input_size] → (output [B, T, H], (h [1, B, H], c [1, B, H]))."""
        if self.per_sample and not self.unrolled and hx is None:
            return self._per_sample(x)
        if not self.unrolled:
            if hx is None:
                zeros = x.new_zeros(1, x.shape[0], self.hidden_size)
                hx = (zeros, zeros)
            return self._fused(x, hx)
        return self._unrolled(x, hx)

    def _fused(self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor]):
        bias = self.ih.bias
        if bias is None:
            weights = [self.ih.weight, self.hh.weight]
        else:
            weights = [self.ih.weight, self.hh.weight, bias, torch.zeros_like(bias)]
        out, h, c = torch.lstm(x, hx, weights, bias is not None, 1, 0.0, self.training, False, True)
        return out, (h, c)

    def _per_sample(self, x: torch.Tensor):
        """Zero initial state. ``ih`` over all steps, the recurrence without autograd, the
        recurrent products reported as one ``hh`` call on the stored states (made for real if no
        engine hooks ``hh``), joined by :class:`_Recurrence` (see the module docstring)."""
        # [B, T, 4H], one hooked call; the recurrence and its BPTT in float32 whatever the autocast
        # (client.precision=bf16 runs this product in bfloat16: its gradient flows back through the cast)
        x_gates = as_fp32(self.ih(x))
        w_hh = self.hh.weight.detach()  # the recurrent product inside _Recurrence is not a hooked call
        with torch.no_grad():
            states = _recurrence_forward(x_gates.detach(), w_hh)
        h_prev = computed_from(states.hidden[:, :-1], x)  # h_0..h_{T-2}: per sample, from x
        h_gates = record_call(self.hh, h_prev, _Products.apply(x_gates, states.hh_products))
        if h_gates is None:  # no engine: the real call, so that autograd reaches hh.weight
            h_gates = self.hh(h_prev)
        out, c = _Recurrence.apply(x_gates, h_gates, w_hh, states)
        return out, (out[:, -1].unsqueeze(0), c.unsqueeze(0))

    def _unrolled(self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None):
        """Step by step. A zero initial state (``hx=None``) skips step 0's ``hh`` call: it has no
        bias, so ``hh(0) = 0`` and its weight's gradient from that step is 0 — the same function,
        and no batch-sized constant for per-sample clipping to puzzle over."""
        h, c = (None, None) if hx is None else (hx[0][0], hx[1][0])
        x_gates = self.ih(x)  # one 3-D Linear call over all time steps
        if hx is None and self.lockstep and not self.per_sample:  # cohort-parallel: the recurrence's own BPTT
            hidden, cells, _ = _VmappableRecurrence.apply(x_gates, self.hh.weight)
            return hidden, (hidden[:, -1].unsqueeze(0), cells[:, -1].unsqueeze(0))
        outputs = []
        for t in range(x.shape[1]):
            if h is None:
                gates = x_gates[:, t]
            elif self.per_sample:  # the hooked hh call a clipping engine records
                gates = x_gates[:, t] + self.hh(h)
            else:  # one fused GEMM-and-add (batched under vmap): no separate gate sum
                gates = torch.addmm(x_gates[:, t], h, self.hh.weight.t())
            i, f, g, o = gates.chunk(4, dim=-1)
            c = (torch.sigmoid(i) * torch.tanh(g) if c is None
                 else torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g))
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        return torch.stack(outputs, dim=1), (h.unsqueeze(0), c.unsqueeze(0))


@dataclass(frozen=True)
class _States:
    """What the recurrence keeps for its backward: activated gates ``[σ(i), σ(f), tanh(g), σ(o)]``
    [B, T, 4H], cells ``c_t`` and ``tanh(c_t)`` [B, T, H], outputs ``h_t`` [B, T, H]; and the
    recurrent products ``W_hh h_{t-1}`` of steps 1..T-1 [B, T-1, 4H]."""

    gates: torch.Tensor
    hh_products: torch.Tensor
    cells: torch.Tensor
    tanh_cells: torch.Tensor
    hidden: torch.Tensor


def _recurrence_forward(x_gates: torch.Tensor, w_hh: torch.Tensor) -> _States:
    """The LSTM recurrence from zero state given the input gate products ``x_gates`` [B, T, 4H]:
    ``gates_t = x_gates_t + W_hh h_{t-1}``, then the cell equations of the module docstring."""
    b, steps, four_h = x_gates.shape
    size = four_h // 4
    gates = torch.empty_like(x_gates)
    products = x_gates.new_empty(b, max(steps - 1, 0), four_h)
    cells = x_gates.new_empty(b, steps, size)
    tanh_cells = torch.empty_like(cells)
    hidden = torch.empty_like(cells)
    for t in range(steps):
        if t == 0:
            pre = x_gates[:, 0]
        else:
            torch.mm(hidden[:, t - 1], w_hh.t(), out=products[:, t - 1])
            pre = x_gates[:, t] + products[:, t - 1]
        act = gates[:, t]
        torch.sigmoid(pre, out=act)
        torch.tanh(pre[:, 2 * size:3 * size], out=act[:, 2 * size:3 * size])
        i, f, g, o = act.chunk(4, dim=-1)
        c = i * g if t == 0 else torch.addcmul(i * g, f, cells[:, t - 1])
        cells[:, t] = c
        torch.tanh(c, out=tanh_cells[:, t])
        torch.mul(o, tanh_cells[:, t], out=hidden[:, t])
    return _States(gates, products, cells, tanh_cells, hidden)


def _step_factors(gates: torch.Tensor, cells: torch.Tensor, tanh_cells: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step-local factors of back-propagation through time, for all steps at once, from the
    activated gates ``[σ(i), σ(f), tanh(g), σ(o)]`` [B, T, 4H] and the cells (zero initial state):
    ``to_cell = σ(o)(1 − tanh²c_t)`` (∂c_t ← ∂h_t), ``coef = [tanh(g)σ(i)(1−σ(i)), c_{t−1}σ(f)(1−σ(f)),
    σ(i)(1 − tanh²g)]`` (δ_i, δ_f, δ_g ← ∂c_t), ``coef_o = tanh(c_t)σ(o)(1−σ(o))`` (δ_o ← ∂h_t),
    and ``σ(f)`` (∂c_{t−1} ← ∂c_t). Both recurrences' backwards (:class:`_Recurrence`,
    :class:`_VmappableRecurrence`) run their recursion on these."""
    i, f, g, o = gates.chunk(4, dim=-1)  # [B, T, H] each
    c_prev = torch.cat([torch.zeros_like(cells[:, :1]), cells[:, :-1]], 1)
    to_cell = o * (1 - tanh_cells * tanh_cells)
    coef = torch.cat([g * i * (1 - i), c_prev * f * (1 - f), i * (1 - g * g)], -1)
    coef_o = tanh_cells * o * (1 - o)
    return to_cell, coef, coef_o, f


class _Products(torch.autograd.Function):
    """The recurrent products the recurrence formed, ``products`` [B, T-1, 4H], as a tensor in the
    graph (hanging off ``anchor``, which gets no gradient from it): autograd hands it the
    gradient :class:`_Recurrence` gives its ``h_gates``, which is all BK needs of the ``hh`` call."""

    @staticmethod
    def forward(ctx, anchor, products):  # type: ignore[override]
        return products  # an alias of the stored products, which nothing else reads or writes: no copy

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return None, None


class _Recurrence(torch.autograd.Function):
    """``(x_gates [B,T,4H], h_gates [B,T-1,4H]) → (h [B,T,H], c_T [B,H])`` for the per-sample
    forward; the pre-activations are ``x_gates_t + h_gates_t`` (``h_gates_0 = 0``).

    The forward returns the states the recurrence already computed. The backward is
    back-propagation through time: with ``δ_t = ∂L/∂gates_t`` (the *total* derivative),
    ``∂L/∂h_t = ∂ℓ/∂h_t + W_hhᵀ δ_{t+1}``, and ``δ_t`` from the cell equations; both inputs get
    ``δ`` (``h_gates`` its steps 1..T-1). The recurrent product is done here, so the ``hh`` call's
    input (the stored states) needs no gradient: its only other effect on the loss is the one
    already inside ``δ``.
    """

    @staticmethod
    def forward(ctx, x_gates, h_gates, w_hh, states: _States):  # type: ignore[override]
        ctx.states, ctx.w_hh = states, w_hh
        return states.hidden.clone(), states.cells[:, -1].clone()

    @staticmethod
    def backward(ctx, d_hidden, d_cell):  # type: ignore[override]
        s: _States = ctx.states
        w_hh = ctx.w_hh
        b, steps, four_h = s.gates.shape
        size = four_h // 4
        to_cell, coef, coef_o, f = _step_factors(s.gates, s.cells, s.tanh_cells)
        delta = torch.empty_like(s.gates)
        d_h = None  # W_hhᵀ δ_{t+1}
        d_c = d_cell.clone() if d_cell is not None else s.cells.new_zeros(b, size)
        for t in reversed(range(steps)):
            dh = d_hidden[:, t] if d_h is None else d_hidden[:, t] + d_h
            d_c = torch.addcmul(d_c, dh, to_cell[:, t])
            torch.mul(d_c.repeat(1, 3), coef[:, t], out=delta[:, t, :3 * size])
            torch.mul(dh, coef_o[:, t], out=delta[:, t, 3 * size:])
            if t:
                d_c = d_c * f[:, t]
                d_h = torch.mm(delta[:, t], w_hh)
        return delta, delta[:, 1:].contiguous(), None, None  # contiguous: BK's products flatten it


class _VmappableRecurrence(torch.autograd.Function):
    """``(x_gates [B,T,4H], W_hh [4H,H]) → (h [B,T,H], c [B,T,H], activated gates [B,T,4H])`` from
    zero state, with back-propagation through time of its own; written in plain torch ops with
    ``setup_context`` and ``generate_vmap_rule``, so ``torch.func.vmap``/``grad`` run it over stacked
    per-client parameters (cohort-parallel training; the fused kernel has no batching rule).

    What autograd through the unrolled steps does and this does not: it formed ``W_hh``'s gradient
    as T−1 outer products ``δ_t h_{t−1}ᵀ`` of a batch's rows each and summed them one add at a time
    (under vmap, T−1 skinny GEMMs and T−1 adds of a [clients, 4H, H] tensor per local step); here
    it is one GEMM over all steps, ``Σ_t δ_t h_{t−1}ᵀ = δ[:,1:]ᵀ h[:,:−1]`` with ``δ_t = ∂L/∂gates_t``
    (the same BPTT as :class:`_Recurrence`). The gate sum is one ``addmm`` per step. The gradients
    are returned in the inputs' dtypes (under bfloat16 autocast the products run in bfloat16)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x_gates, w_hh):  # type: ignore[override]
        size = x_gates.shape[-1] // 4
        h = c = None
        hidden, cells, acts = [], [], []
        for t in range(x_gates.shape[1]):
            pre = x_gates[:, t] if h is None else torch.addmm(x_gates[:, t], h, w_hh.t())
            s = torch.sigmoid(pre)
            g = torch.tanh(pre[:, 2 * size:3 * size])
            i, f, o = s[:, :size], s[:, size:2 * size], s[:, 3 * size:]
            c = i * g if c is None else f * c + i * g
            h = o * torch.tanh(c)
            hidden.append(h)
            cells.append(c)
            acts.append(torch.cat([i, f, g, o], -1))
        return torch.stack(hidden, 1), torch.stack(cells, 1), torch.stack(acts, 1)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        x_gates, w_hh = inputs
        hidden, cells, acts = output
        ctx.mark_non_differentiable(acts)
        ctx.dtypes = (x_gates.dtype, w_hh.dtype)
        ctx.save_for_backward(w_hh, hidden, cells, acts)

    @staticmethod
    def backward(ctx, d_hidden, d_cells, _d_acts):  # type: ignore[override]
        w_hh, hidden, cells, acts = ctx.saved_tensors
        steps, size = acts.shape[1], acts.shape[-1] // 4
        w_hh = w_hh.to(acts.dtype)  # the products' dtype (bfloat16 under autocast), autocast on or not
        to_cell, coef, coef_o, f = _step_factors(acts, cells, torch.tanh(cells))
        # the recursion of _Recurrence.backward in plain ops (no writes into a preallocated tensor: vmap)
        deltas: list = [None] * steps
        d_h = d_c = None
        for t in reversed(range(steps)):
            dh = d_hidden[:, t] if d_h is None else d_hidden[:, t] + d_h
            dc = dh * to_cell[:, t] + d_cells[:, t]
            if d_c is not None:
                dc = dc + d_c
            deltas[t] = torch.cat([dc.repeat(1, 3) * coef[:, t], dh * coef_o[:, t]], -1)
            if t:
                d_c = dc * f[:, t]
                d_h = deltas[t].mm(w_hh)
        delta = torch.stack(deltas, 1)  # [B, T, 4H]: ∂L/∂gates_t, the recurrent path included
        d_w = delta[:, 1:].reshape(-1, 4 * size).t().mm(hidden[:, :-1].reshape(-1, size).to(delta.dtype))
        return delta.to(ctx.dtypes[0]), d_w.to(ctx.dtypes[1])


def _per_sample_forward(module: LSTM) -> Callable[[], None]:
    """Clipping ``prepare`` step: the per-sample forward, in which ``ih`` and ``hh`` are used only
    through their own (hooked) ``nn.Linear`` calls; the returned undo restores the flag."""
    before = module.per_sample
    module.per_sample = True

    def undo() -> None:
        module.per_sample = before
    return undo


# The LSTM owns no parameter itself (min_batched_ndim 3: input [B, T, input_size]).
register_rule(LSTM, LayerRule(no_contributions, (), lambda m: 3, prepare=_per_sample_forward))
register_hint(nn.LSTM, "use fedpriv.models.LSTM (gates are nn.Linear) instead of nn.LSTM")
register_hint(nn.GRU, "build the recurrent cell from nn.Linear pieces (as fedpriv.models.LSTM does)")
register_hint(nn.RNN, "build the recurrent cell from nn.Linear pieces (as fedpriv.models.LSTM does)")
register_hint(nn.LSTMCell, "use fedpriv.models.LSTM, or nn.Linear gates, instead of nn.LSTMCell")


class LSTMLanguageModel(nn.Module):
    """Embedding → LSTM → Linear projection → Linear output (TFF StackOverflow baseline).

    Defaults (embed 96, hidden 670, projection 96) give 4,050,748 parameters at vocab 10,004.
    """

    def __init__(self, vocab_size: int, embed_dim: int = 96, hidden_size: int = 670,
                 projection_dim: int = 96, pad_id: int = 0, tie_embeddings: bool = False) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        self.lstm = LSTM(embed_dim, hidden_size)
        self.projection = nn.Linear(hidden_size, projection_dim)
        self.output = nn.Linear(projection_dim, vocab_size)
        if tie_embeddings:  # output weight = input embedding (needs projection_dim == embed_dim)
            if projection_dim != embed_dim:
                raise ValueError(f"tie_embeddings needs projection_dim == embed_dim, "
                                 f"got {projection_dim} != {embed_dim}")
            self.output.weight = self.embedding.weight

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens``: int [B, T] → the output layer's input [B, T, projection_dim]."""
        hidden, _ = self.lstm(self.embedding(tokens))
        return self.projection(hidden)

    def head(self, features: torch.Tensor) -> torch.Tensor:
        """Output layer: features [..., projection_dim] → logits [..., vocab_size]."""
        return self.output(features)

    def forward(self, tokens: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """``tokens``: int [B, T] → logits [B, T, vocab_size]; with a bool ``keep`` [B, T], the
        logits at the kept positions only, [N, vocab_size] (:func:`fedpriv.clipping.flat_positions`)."""
        features = self.features(tokens)
        return self.head(features if keep is None else flat_positions(features, keep))


# --- config options (fedpriv/schema/parser.py registers them with Hydra) -------------------------


@dataclass
class LSTMModel(ModelOption):
    model_class: ClassVar[type] = LSTMLanguageModel
    name: str = "lstm"
    embed_dim: int = 64  # width of the word embedding
    hidden_size: int = 128  # LSTM state width
    projection_dim: int = 64  # width of the projection between the LSTM and the output layer

    def check(self, path: str) -> None:
        positive(self, "embed_dim", "hidden_size", "projection_dim", path=path)


register_option("model", "lstm", LSTMModel())
# the smoke experiment's size (`+experiment=smoke`; `model=` still switches architecture)
register_option("model", "lstm_tiny", LSTMModel(embed_dim=16, hidden_size=32, projection_dim=16))

