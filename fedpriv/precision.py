"""The arithmetic of the clients' computation: ``precision=fp32|tf32|bf16`` (default fp32).

* ``fp32``: IEEE float32 throughout. On an NVIDIA GPU this turns TensorFloat-32 *off* for cuBLAS
  matmuls and for cuDNN's RNN and convolution kernels — torch's own default runs cuDNN's LSTM in
  TF32 (10-bit mantissa) on Ampere and later GPUs, which made the loop's deltas differ from the
  cohort-parallel ones by 7% over a local epoch on an H200 (docs/BENCHMARKS.md, "On a GPU").
* ``tf32``: float32 tensors, with matmuls, cuDNN RNNs and convolutions in TF32 where the GPU has
  tensor cores for it. A CPU has no TF32: there it computes what ``fp32`` computes.
* ``bf16``: ``tf32`` plus ``torch.autocast`` to bfloat16 on the device for the ops autocast lists
  (linear, matmul, bmm, ...). Parameters, their gradients, the optimizer step and the deltas stay
  float32 (autocast casts copies for the op); the loss is computed in float32.

What the mode never changes (:func:`exact_fp32`): the DP arithmetic. Per-example and per-user
norms, clip factors, the clipped sums and the noise are computed in IEEE float32 from float32
copies of what the forward and backward produced — Book-Keeping's backward after its one autograd
call (:meth:`fedpriv.clipping.BookKeeping.backward`), the cohort-parallel example-level DP step,
and the round's clipped sum of the users' deltas. A clipped unit's contribution is built from the
same values its norm was computed from, so the bound ``‖clip(g)‖ ≤ C`` holds to float32 rounding
whatever the mode. Lower precision changes *which* gradient a client computes (rounding of the
forward and backward), never the sensitivity the accountant assumes. Evaluation always runs in
``fp32``, so reported metrics compare across modes.

The TF32 switches are process-global in torch (autocast is per thread); :func:`compute_precision`
sets them for the duration of a block and restores what was there, so torch work on another
thread during the block sees the block's mode. ``torch.backends.mkldnn`` (the CPU's own
``fp32_precision``) is left as it is: "tf32 on a CPU computes what fp32 does" assumes its
default. torch ≥ 2.9 has per-backend ``fp32_precision`` switches and refuses a process that mixes
them with the older ``allow_tf32`` ones; both are handled (the newer where it exists).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

PRECISIONS = ("fp32", "tf32", "bf16")
#: each mode's cuBLAS/cuDNN float32 setting ("ieee": exact float32)
_FP32_MODE = {"fp32": "ieee", "tf32": "tf32", "bf16": "tf32"}


def _switches() -> list[tuple[object, str]]:
    """The (object, attribute) pairs of the float32-precision switches of this torch."""
    backends = torch.backends
    if hasattr(backends.cuda.matmul, "fp32_precision"):
        return [(backends.cuda.matmul, "fp32_precision"), (backends.cudnn.rnn, "fp32_precision"),
                (backends.cudnn.conv, "fp32_precision")]
    return [(backends.cuda.matmul, "allow_tf32"), (backends.cudnn, "allow_tf32")]


def _value(attribute: str, mode: str) -> object:
    return mode if attribute == "fp32_precision" else mode == "tf32"


@contextmanager
def _float32_mode(mode: str) -> Iterator[None]:
    """cuBLAS and cuDNN float32 arithmetic ``mode`` ("ieee" or "tf32") inside the block."""
    saved = [(owner, name, getattr(owner, name)) for owner, name in _switches()]
    try:
        for owner, name, _ in saved:
            setattr(owner, name, _value(name, mode))
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


@contextmanager
def compute_precision(precision: str, device: torch.device) -> Iterator[None]:
    """Run the block's tensor arithmetic on ``device`` in ``precision`` (see the module docstring)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    with _float32_mode(_FP32_MODE[precision]):
        # bf16: autocast to bfloat16; fp32/tf32: autocast off on the device, whatever a caller set
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            yield


@contextmanager
def exact_fp32() -> Iterator[None]:
    """IEEE float32 inside the block, whatever :func:`compute_precision` set around it: no TF32,
    no autocast (on any device type). The DP arithmetic (norms, clip factors, clipped sums, noise)
    runs here, on float32 copies (:func:`as_fp32`)."""
    with _float32_mode("ieee"), torch.autocast("cpu", enabled=False):
        if torch.cuda.is_available():
            with torch.autocast("cuda", enabled=False):
                yield
        else:
            yield


def as_fp32(x: torch.Tensor) -> torch.Tensor:
    """``x`` as float32 if it is a floating tensor of lower precision (bf16/fp16 activations or
    output gradients under autocast); any other tensor unchanged."""
    if x.is_floating_point() and torch.finfo(x.dtype).bits < 32:
        return x.float()
    return x
