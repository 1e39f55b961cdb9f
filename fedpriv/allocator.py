"""Keep freed memory for reuse: glibc's allocator tuned for a process that allocates the same large
tensors step after step.

By default glibc serves an allocation above its mmap threshold (128 KiB, raised dynamically up to
32 MiB) with a fresh ``mmap`` and returns it to the OS when freed, and trims the heap's free top
above 128 KiB. A tensor of that size is then new memory at every step, and its first touch
page-faults page by page: on this project's 2-core VM a 72 MB logits tensor of the one-pass
DP-FedSGD head cost ≈ 16 ms in zero-filling alone, the same again in each copy into fresh memory.
:func:`retain_freed_memory` raises the mmap threshold to 256 MiB, the trim threshold to 1 GiB and
the top pad to 256 MiB (``mallopt``), so freed blocks go back to the heap and the next step reuses
them resident. Peak memory is what it was (freed memory is kept, not added); the resident size
stays near the peak instead of shrinking between steps.

It changes no value anywhere (only where the allocator finds memory). Runs apply it
(:func:`fedpriv.runner.prepare`, which ``python -m fedpriv.simulate``, deployments and the round
benchmarks go through, and the ClientApp), and so does ``scripts/bench_fedsgd.py``; it does nothing
where the C library is not glibc, where the user tuned malloc themselves (any ``MALLOC_*``
variable, or ``glibc.malloc.*`` in ``GLIBC_TUNABLES``: theirs win), or with
``FEDPRIV_SYSTEM_MALLOC=1``. glibc before 2.35 refuses an mmap threshold above 32 MiB; there the
threshold is set to 32 MiB (tensors above it still come fresh) and the other two as above.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
SETTINGS = {M_MMAP_THRESHOLD: 256 << 20, M_TRIM_THRESHOLD: 1 << 30, M_TOP_PAD: 256 << 20}
OPT_OUT = "FEDPRIV_SYSTEM_MALLOC"


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    if not (hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt")):
        return None
    libc.gnu_get_libc_version.restype = ctypes.c_char_p
    return libc


def _version(libc: ctypes.CDLL) -> tuple[int, int]:
    major, minor = libc.gnu_get_libc_version().decode().split(".")[:2]
    return int(major), int(minor)


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the running glibc, or None where the C library is another."""
    libc = _glibc()
    return None if libc is None else _version(libc)


def _users_own() -> bool:
    return (os.environ.get(OPT_OUT) == "1" or any(k.startswith("MALLOC_") for k in os.environ)
            or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""))


def retain_freed_memory() -> bool:
    """Tune glibc's malloc to keep freed memory (module docstring); True if every setting took."""
    if _users_own():
        return False
    libc = _glibc()
    if libc is None:
        return False
    settings = dict(SETTINGS)
    if _version(libc) < (2, 35):  # older glibc caps the mmap threshold (HEAP_MAX_SIZE / 2 = 32 MiB)
        settings[M_MMAP_THRESHOLD] = 32 << 20
    return all([libc.mallopt(param, value) == 1 for param, value in settings.items()])  # each applied
