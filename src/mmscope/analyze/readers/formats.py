"""Recognise a profile file by its first bytes and hand it to the right loader.

An `.nsys-rep` is first exported to SQLite with the `nsys` binary, when one is on PATH.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from mmscope.analyze.readers import chrome, nsys
from mmscope.analyze.ranges.table import RangeTable
from mmscope.errors import UserError

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


def load_profile(path: str, workers: int | None = None, quiet: bool = False) -> RangeTable:
    """The RangeTable of an nsys SQLite export, an nsys report, a Chrome trace JSON, or a folder
    of Chrome traces (one per process, as mmscope's chrome backend writes them)."""
    table = _load(path, workers, quiet)
    if len(table) == 0:
        raise UserError(f"{path}: no NVTX ranges or marks in the profile (nothing to analyze; a "
                        "torch trace's ranges are its record_function annotations)")
    return table


def _load(path: str, workers: int | None, quiet: bool) -> RangeTable:
    if os.path.isdir(path):
        return _load_trace_folder(path)
    head = _head(path)
    if nsys.is_sqlite(head):
        return nsys.load(path, workers=workers)
    if path.endswith(REPORT_SUFFIXES):
        return _load_report(path, workers, quiet)
    if chrome.looks_like_json(head):
        return chrome.load(path)
    if not head:
        raise UserError(f"{path}: empty file")
    raise UserError(f"{path}: not a profile (expected an nsys SQLite export, an .nsys-rep "
                    "report or a Chrome trace JSON)")


def _load_trace_folder(path: str) -> RangeTable:
    files = sorted(os.path.join(path, f) for f in os.listdir(path)
                   if f.endswith((".json", ".json.gz")))
    if not files:
        raise UserError(f"{path}: a folder without Chrome trace files (*.json, *.json.gz)")
    return chrome.load_all(files, path)


def _head(path: str) -> bytes:
    if not os.path.exists(path):
        raise UserError(f"{path}: no such file")
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, not a profile file")
    try:
        with open(path, "rb") as f:
            return f.read(64)
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None


def _load_report(path: str, workers: int | None, quiet: bool) -> RangeTable:
    exe = shutil.which("nsys")
    if exe is None:
        raise UserError(f"{path} is an Nsight Systems report and reading it needs `nsys` on PATH; "
                        f"or export it yourself: nsys export --type sqlite {path}")
    with tempfile.TemporaryDirectory(prefix="mmscope-") as tmp:
        out = os.path.join(tmp, "report.sqlite")
        if not quiet:
            print(f"mmscope: exporting {path} with {exe} export --type sqlite", file=sys.stderr)
        cmd = [exe, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", out,
               path]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not os.path.exists(out):
            why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise UserError(f"{path}: nsys export failed: {why}")
        return nsys.load(out, workers=workers)
