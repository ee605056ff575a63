"""The stage-level profile analyzer: load a profile into one range table, then compute on it.

`load(path)` reads an nsys SQLite export, an `.nsys-rep` (through `nsys export`) or a Chrome trace.
"""
from __future__ import annotations


def load(path: str, **kwargs):
    """The `RangeTable` of a profile file, whatever its format (readers/formats.py)."""
    from mmscope.analyze.readers.formats import load_profile

    return load_profile(path, **kwargs)
