"""NVTX capture without Nsight Systems: `mmscope record` and the nsys-schema SQLite it writes.

The C injection library records into per-process spool files; `writer` turns them into one export.
"""
from __future__ import annotations

import glob
import os


def native_library(stem: str) -> str | None:
    """Path of one of the package's C libraries (`_nvtx_inject`), or None."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, f"{stem}*.so")))
    return found[0] if found else None
