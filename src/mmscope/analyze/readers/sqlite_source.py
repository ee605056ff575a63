"""Read an SQLite file through ADBC's SQLite driver into Arrow columns, leaving the file as found:
opened read-only (a URI with mode=ro); large tables read in rowid ranges, one connection and
thread each, so that both cores read.

A file in WAL mode without its `-shm` is read from a private copy: SQLite would create that (and
a `-wal`) beside it even to read it.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import urllib.parse

import numpy as np

WAL_SUFFIX, SHM_SUFFIX = "-wal", "-shm"
HEADER_BYTES = 100
# Header bytes 18 and 19 are the read and write format versions: 2 in WAL mode, 1 otherwise.
WAL_FORMAT = 2
# Rows a batch: few chunks to copy, and SQLite's own type of a column is taken from the first.
BATCH_ROWS = 1 << 16
BUSY_TIMEOUT_MS = 10_000


def companions(path: str) -> list[str]:
    """The files beside a database that its contents depend on (the `-wal`), where present."""
    wal = path + WAL_SUFFIX
    return [wal] if os.path.exists(wal) else []


def in_wal_mode(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    return len(head) >= 20 and head[18] == WAL_FORMAT


def needs_copy(path: str) -> bool:
    """A WAL database without a `-shm`: reading in place would create it and a `-wal`."""
    return in_wal_mode(path) and not os.path.exists(path + SHM_SUFFIX)


@contextlib.contextmanager
def readable(path: str):
    """A path that reads as `path` does now, without writing beside `path`."""
    if not needs_copy(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="mmscope-read-") as tmp:
        copy = os.path.join(tmp, os.path.basename(path))
        shutil.copyfile(path, copy)
        if os.path.exists(path + WAL_SUFFIX):
            shutil.copyfile(path + WAL_SUFFIX, copy + WAL_SUFFIX)
        yield copy


def connect(path: str):
    """An ADBC connection to `path`, read-only; it waits for a lock another connection holds a
    moment (readers of a database in WAL mode take one while they open it)."""
    import adbc_driver_sqlite.dbapi as adbc

    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    con = adbc.connect(uri)
    with con.cursor() as cur:
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return con


def frame(con, query: str):
    """A query's result as a polars DataFrame (Arrow handed over, no row through Python)."""
    import polars as pl

    with con.cursor() as cur:
        cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
        cur.execute(query)
        return pl.DataFrame(cur.fetch_arrow())


def rowid_ranges(con, table: str, parts: int) -> list[tuple[int, int]]:
    """`parts` rowid ranges (lo, hi] that cover the table, split evenly by rowid."""
    got = frame(con, f"SELECT coalesce(min(rowid), 0) - 1 AS lo, coalesce(max(rowid), 0) AS hi "
                     f"FROM {table}")
    lo, hi = got.row(0)
    cuts = [lo + (hi - lo) * k // parts for k in range(parts + 1)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a] or [(lo, hi)]


def partitioned(path: str, query: str, ranges: list[tuple[int, int]]) -> list:
    """`query` (which ends in a WHERE clause taking `rowid > ? AND rowid <= ?`, formatted in as
    {lo} and {hi}) over each rowid range, on its own connection and thread: the DataFrames in
    rowid order. The driver steps SQLite without Python's lock, so the ranges read at once."""
    out: list = [None] * len(ranges)
    errors: list[BaseException] = []

    def read(k: int, lo: int, hi: int) -> None:
        try:
            with contextlib.closing(connect(path)) as con:
                out[k] = frame(con, query.format(lo=lo, hi=hi))
        except BaseException as e:  # re-raised in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=read, args=(k, lo, hi)) for k, (lo, hi) in
               enumerate(ranges)]
    for t in threads[1:]:
        t.start()
    read(0, *ranges[0])
    for t in threads[1:]:
        t.join()
    if errors:
        raise errors[0]
    return out


def numpy_column(parts: list, name: str, dtype, null) -> np.ndarray:
    """One column of the parts as one numpy array of `dtype`, NULLs as `null`, each chunk copied
    once into place (the Arrow chunks freed as they go)."""
    n = sum(p.height for p in parts)
    out = np.empty(n, dtype)
    at = 0
    for part in parts:
        series = part.drop_in_place(name)
        for chunk in series.get_chunks():
            if chunk.null_count():
                chunk = chunk.fill_null(null)
            out[at:at + len(chunk)] = chunk.to_numpy()
            at += len(chunk)
        del series
    return out
