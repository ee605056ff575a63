"""Settings for a process about to work on columns of millions of rows (the analyzer, the
recorder's writer), made before numpy is imported; a child it starts gets its own environment.
"""
from __future__ import annotations

import ctypes
import os

# glibc's mallopt(3) setting of the size from which a block is mapped on its own: set, it is
# fixed (glibc otherwise raises it to the largest block freed so far, up to 32 MiB).
M_MMAP_THRESHOLD, MMAP_FROM = -3, 1 << 20


def plain_pages() -> None:
    """Plain pages and one BLAS thread, unless the user's environment says otherwise."""
    # numpy's transparent huge pages make each fresh large array wait for the kernel to compact
    # memory on these shared machines (about 1 s of system time on 10 M rows analyzed, 3 s a
    # 480 MiB column written, measured); the work allocates many short-lived arrays.
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    # OpenBLAS's threads spin between calls (about 3 % of an analysis of 10 M rows, measured
    # with perf) and the analysis makes one small BLAS call (the step fit).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def return_freed_memory() -> None:
    """Blocks of a MiB or more mapped on their own, so that each goes back to the system when
    freed: the analysis frees many columns of a few MiB, which would otherwise stay in the
    process' heap (about 50 MiB of peak memory on 10 M rows, measured). Not for work that
    allocates the same blocks over and over (the recorder's windows): each fresh mapping is
    touched page by page again. glibc only."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MMAP_FROM)
