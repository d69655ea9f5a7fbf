"""The C allocator of a psoup server process: keep the memory it frees.

A server answers invocation after invocation, and an answer of tens of thousands of rows
is a few hundred kilobytes of columns, of their encoding and of the reply frame. glibc's
malloc serves blocks that large by mmap, or from the top of its heap, and hands them back
to the kernel when they are freed, so the next answer faults its memory in again, a page
at a time. Measured on the benchmark machine, 64 handles of 15,764-row answers invoked in
turn through one client: 219 page faults and 1.08 ms of server CPU per invocation by
default, none and 0.83 ms once the allocator keeps what it frees (an embedded engine
whose caller holds the answers of many handles at once: 336 us against 143 us per
invocation).

`keep_freed_memory` raises two thresholds of glibc's malloc for the whole process:
blocks below MMAP_THRESHOLD come from the heap, and up to TRIM_THRESHOLD of free memory
at the top of the heap stays there. The price is that the process's resident memory does
not shrink after a peak. `psoup serve` (`run_server`) calls it, since it owns its
process; a program embedding an engine may call it for itself. It does nothing under
another C library, or when the environment already sets these thresholds (GLIBC_TUNABLES,
MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_): the user's choice stands.
"""

from __future__ import annotations

import ctypes
import os

#: mallopt's parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: Blocks below this come from the heap, never from mmap (64 MiB: any answer short of
#: millions of rows).
MMAP_THRESHOLD = 64 << 20
#: Free memory at the top of the heap kept rather than handed back to the kernel.
TRIM_THRESHOLD = 512 << 20


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep the memory the process frees (see the module docstring);
    returns whether it now does. O(1), once per process; safe to call again."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if ("mmap_threshold" in tunables or "trim_threshold" in tunables
            or "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):         # not glibc (or no C library to ask)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
