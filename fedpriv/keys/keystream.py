"""Secret Gaussian noise: a ChaCha20 keystream turned into normals, drawn in blocks on every core
(a foundation: Book-Keeping's gradient noise and the run's randomness both draw from it).

A :class:`GaussianKeystream` holds a 256-bit key. Its ``j``-th block of :data:`BLOCK` normals is
read from ChaCha20 (RFC 7539) under that key with nonce ``j`` and the block counter from 0. For a
block of L coordinates (P = ⌈L/2⌉ pairs) the keystream gives each pair a radius word and an angle
word ``w'`` (32 bits, little-endian): ``θ = 2π·w'·2⁻³²``, and Box–Muller makes the block
``[√(−2 ln u)·cos θ  (P values), √(−2 ln u)·sin θ  (the other L − P)]`` in float32. The radius's
uniform ``u ∈ (0, 1]`` has two resolutions:

* ``wide_tail=False`` (clients' example-level noise, Book-Keeping's per-step noise): a 32-bit word
  ``w``, ``u = w·2⁻³² + 2⁻³³``, so ``|z| ≤ √(2·33·ln 2) ≈ 6.76``; the block reads P radius words,
  then P angle words.
* ``wide_tail=True`` (the server mechanisms' noise, :class:`fedpriv.keys.randomness.NoiseStream`): a
  64-bit word ``w``, ``u = fl32(w)·2⁻⁶⁴ + 2⁻⁶⁵`` (the float32 conversion keeps 24 significant bits
  at every scale, so small ``u`` keep their relative precision), so ``|z| ≤ √(2·65·ln 2) ≈ 9.49``;
  the block reads P 64-bit radius words, then P angle words. About 1.5× (2 threads) to 1.7×
  (1 thread) the narrow draw's time.

Both: ChaCha20 is a stream cipher: without the key its output is indistinguishable from uniform
bits, so the noise is as secret as the key (256 bits; nothing about it is stored or sent). Blocks
use distinct nonces, so no two blocks of one stream ever share keystream, and the stream does not
pass through any 32- or 64-bit seed. The draw is the same on any number of threads: block ``j``
depends only on ``(key, j)``; the blocks go to a thread pool of ``torch.get_num_threads()``
workers (numpy's ufuncs release the GIL; the cipher holds it), and each writes a disjoint slice.
The pool threads add into host tensors with numpy, never with a torch op: a parallel torch op
called from another thread starts another OpenMP team, and after one such draw the process's
torch training ran 1.35× slower (measured: 100 LSTM client updates, 4.1 s → 5.6 s on 2 cores);
device tensors are copied and added by torch there (no OpenMP), and a host dtype numpy lacks
(bfloat16), like a tensor that requires grad, is added on the calling thread, block by block. A
tensor written through numpy has its autograd version bumped, as an in-place op would.

torch's own float32 ``normal_`` stops near 5.8. Like every floating-point sampler this leaves
Mironov's least-significant-bit attack open ("On Significance of the Least Significant Bits for
Differential Privacy"). Noise is computed in float32 and added to tensors of any dtype.

Never use a seeded ``torch.Generator`` for a secret draw: torch's CPU generator keeps only the
low 32 bits of its seed, so a search over 2³² seeds replays it.
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from torch import Tensor

BLOCK = 1 << 20  # normals per block (fixed: the draw must not depend on the thread count)
KEY_BYTES = 32
MIN_KEY_BYTES = 16  # 128 bits: a shorter key could be searched
_DERIVE_TAG = b"fedpriv gaussian keystream key v1\x00"
_pool: Optional[ThreadPoolExecutor] = None
_pool_key: tuple[int, int] = (0, 0)  # (pid, workers) the pool was made for: a forked child makes its own
_scratch = threading.local()


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_key
    key = (os.getpid(), workers)
    if _pool is None or _pool_key != key:
        _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fedpriv-noise")
        _pool_key = key
    return _pool


def run_blocks(draw: Callable[[int], None], count: int) -> None:
    """``draw(j)`` for every block ``j < count``, on ``torch.get_num_threads()`` pool threads."""
    workers = min(torch.get_num_threads(), count)
    if workers > 1:
        list(_executor(workers).map(draw, range(count)))
    else:
        for j in range(count):
            draw(j)


def _buffers() -> tuple[memoryview, bytearray, np.ndarray, np.ndarray, np.ndarray]:
    """This thread's reusable buffers: zeros to encrypt, the keystream (room for a wide block's 12
    bytes a pair), three float32 halves."""
    held = getattr(_scratch, "held", None)
    if held is None:
        half = BLOCK // 2
        held = _scratch.held = (memoryview(bytes(12 * half)), bytearray(12 * half + 64),
                                np.empty(half, np.float32), np.empty(half, np.float32), np.empty(half, np.float32))
    return held


def _nonce(block: int) -> bytes:
    """ChaCha20's 16-byte IV: the 32-bit block counter (0), then the block index as the nonce."""
    return bytes(4) + int(block).to_bytes(8, "little") + bytes(4)


def _fill_block(key: bytes, block: int, size: int, wide_tail: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Block ``block``'s ``size`` normals as two float32 views (the cos half, then the sin half)
    into this thread's buffers: valid until this thread's next call."""
    zeros, stream, radius, angle, first = _buffers()
    pairs = (size + 1) // 2
    radius_bytes = (8 if wide_tail else 4) * pairs
    cipher = Cipher(algorithms.ChaCha20(key, _nonce(block)), mode=None).encryptor()
    cipher.update_into(zeros[:radius_bytes + 4 * pairs], stream)
    r, a, c = radius[:pairs], angle[:pairs], first[:pairs]
    if wide_tail:
        np.copyto(r, np.frombuffer(stream, dtype="<u8", count=pairs), casting="unsafe")
        r *= np.float32(2.0 ** -64)
        r += np.float32(2.0 ** -65)  # u in (0, 1]: the log is finite
    else:
        np.copyto(r, np.frombuffer(stream, dtype="<u4", count=pairs), casting="unsafe")
        r *= np.float32(2.0 ** -32)
        r += np.float32(2.0 ** -33)  # u in (0, 1]: the log is finite
    np.log(r, out=r)
    r *= np.float32(-2.0)
    np.sqrt(r, out=r)
    np.copyto(a, np.frombuffer(stream, dtype="<u4", count=pairs, offset=radius_bytes), casting="unsafe")
    a *= np.float32(2.0 * math.pi * 2.0 ** -32)
    np.cos(a, out=c)
    c *= r
    np.sin(a, out=a)
    a *= r
    return c, a[:size - pairs]


def _host_array(flat: Tensor) -> Optional[np.ndarray]:
    """A numpy view sharing ``flat``'s memory when it is a host tensor of a dtype numpy adds into
    and outside autograd (a write through numpy bypasses autograd's check of in-place changes)."""
    if (flat.device.type == "cpu" and flat.dtype in (torch.float32, torch.float64, torch.float16)
            and not flat.requires_grad):
        return flat.detach().numpy()
    return None


def stream_key(key: bytes | None = None) -> bytes:
    """The 256-bit key :class:`GaussianKeystream` ``(key)`` reads under: fresh from the OS CSPRNG for
    ``None``; ``key`` itself when it has 32 bytes; else (at least 16) its SHAKE-256 hash to 32. For a
    caller that derives other keyed streams from the same key (with labels of their own)."""
    return secrets.token_bytes(KEY_BYTES) if key is None else _as_key(key)


def _as_key(key: bytes) -> bytes:
    if isinstance(key, torch.Generator) or isinstance(key, int):
        raise TypeError("a noise key is bytes (at least 16): a seeded torch.Generator or an integer seed is not a "
                        "secret (torch's CPU generator keeps 32 bits of its seed)")
    key = bytes(key)
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"a noise key needs at least {MIN_KEY_BYTES} bytes (128 bits), got {len(key)}")
    if len(key) == KEY_BYTES:
        return key
    return hashlib.shake_256(_DERIVE_TAG + key).digest(KEY_BYTES)


class GaussianKeystream:
    """Standard normals from ChaCha20 under a secret key, read block by block (module docstring).

    ``GaussianKeystream()`` takes a fresh 256-bit key from the OS CSPRNG (:func:`secrets.token_bytes`):
    nobody, the caller included, can regenerate its draws. ``GaussianKeystream(key)`` (bytes, at
    least 16; any length but 32 is hashed to 32 with SHAKE-256) is reproducible: whoever holds
    ``key`` regenerates every draw, so it is as secret as the key. The stream's position (the
    next block index) advances with each draw; the key is never printed. ``wide_tail`` reads each
    radius from a 64-bit word (``|z| ≤ 9.49`` instead of 6.76; module docstring).
    """

    def __init__(self, key: bytes | None = None, wide_tail: bool = False) -> None:
        self._key = stream_key(key)
        self.wide_tail = wide_tail
        self.blocks_drawn = 0

    def __repr__(self) -> str:
        return f"GaussianKeystream(blocks_drawn={self.blocks_drawn})"

    def add_(self, tensors: Sequence[Tensor], std: float) -> None:
        """``t += std · N(0, I)`` for every contiguous tensor in ``tensors``, in place: tensor k's
        flat view is cut into blocks of :data:`BLOCK`, numbered on from :attr:`blocks_drawn` in
        order (a zero ``std`` draws nothing)."""
        if std == 0 or not tensors:
            return
        flats = [t.view(-1) for t in tensors]
        blocks = [(k, start, min(start + BLOCK, flat.numel())) for k, flat in enumerate(flats)
                  for start in range(0, flat.numel(), BLOCK)]
        first = self.blocks_drawn
        self.blocks_drawn += len(blocks)

        arrays = [_host_array(flat) for flat in flats]

        def draw(j: int) -> None:
            k, start, stop = blocks[j]
            cos_half, sin_half = _fill_block(self._key, first + j, stop - start, self.wide_tail)
            middle = start + len(cos_half)
            for half, lo, hi in ((cos_half, start, middle), (sin_half, middle, stop)):
                if arrays[k] is not None:  # numpy only: no torch op on a pool thread (module docstring)
                    half *= np.float32(std)
                    np.add(arrays[k][lo:hi], half, out=arrays[k][lo:hi], casting="same_kind")
                else:
                    flats[k][lo:hi].add_(torch.from_numpy(half).to(flats[k].device), alpha=std)

        on_host_by_torch = [arrays[k] is None and flats[k].device.type == "cpu" for k, _, _ in blocks]
        here = [j for j, by_torch in enumerate(on_host_by_torch) if by_torch]
        pooled = [j for j, by_torch in enumerate(on_host_by_torch) if not by_torch]
        run_blocks(lambda i: draw(pooled[i]), len(pooled))
        for j in here:  # bfloat16, or a tensor in autograd: torch adds on this thread
            draw(j)
        for t, array in zip(tensors, arrays):
            if array is not None:  # written through numpy: tell autograd it changed, as an in-place op would
                torch.autograd.graph.increment_version(t)

    def normal(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype = torch.float32) -> Tensor:
        """A fresh tensor of standard normals (the next blocks of the stream)."""
        out = torch.zeros(tuple(shape), dtype=dtype)
        self.add_([out], 1.0)
        return out
