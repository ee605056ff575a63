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
    """`parts` rowid ranges (lo, hi] that cover the table, split evenly by rowid (min and max
    asked apart: SQLite answers each from the table's b-tree without a scan)."""
    lo = frame(con, f"SELECT min(rowid) AS x FROM {table}").item()
    hi = frame(con, f"SELECT max(rowid) AS x FROM {table}").item()
    if lo is None:
        return [(0, 0)]
    lo -= 1
    cuts = [lo + (hi - lo) * k // parts for k in range(parts + 1)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def _on_threads(ranges: list[tuple[int, int]], read) -> None:
    """read(k, lo, hi) for each rowid range, each on its own thread (the first on this one)."""
    errors: list[BaseException] = []

    def run(k: int, lo: int, hi: int) -> None:
        try:
            read(k, lo, hi)
        except BaseException as e:  # re-raised in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k, lo, hi)) for k, (lo, hi) in
               enumerate(ranges)]
    for t in threads[1:]:
        t.start()
    if ranges:
        run(0, *ranges[0])
    for t in threads[1:]:
        t.join()
    if errors:
        raise errors[0]


def partitioned(path: str, query: str, ranges: list[tuple[int, int]]) -> list:
    """`query` (which ends in a WHERE clause taking `rowid > {lo} AND rowid <= {hi}`) over each
    rowid range, on its own connection and thread: the DataFrames in rowid order."""
    out: list = [None] * len(ranges)

    def read(k: int, lo: int, hi: int) -> None:
        with contextlib.closing(connect(path)) as con:
            out[k] = frame(con, query.format(lo=lo, hi=hi))

    _on_threads(ranges, read)
    return [f for f in out if f is not None]


def int_columns(path: str, sources: list[tuple[str, list[tuple[int, int]]]], dtypes: list,
                nulls: list[int]) -> list[np.ndarray]:
    """The integer columns of each source's query (as `partitioned` takes it) over its rowid
    ranges, the sources one after the other (tables of the same columns), each range on its
    own connection and thread, straight from the driver's Arrow batches into numpy arrays
    (NULLs as `nulls`), in rowid order. A range holds at most hi - lo rows: each writes into its
    own slice, and the slices close up after."""
    from mmscope.analyze.readers import arrow_stream

    jobs = [(query, lo, hi) for query, ranges in sources for lo, hi in ranges]
    first = np.concatenate([[0], np.cumsum([hi - lo for _, lo, hi in jobs])]).astype(np.int64)
    first = first.tolist()
    cols = [np.empty(first[-1], dtype) for dtype in dtypes]
    got = [0] * len(jobs)

    def read(k: int, lo: int, hi: int) -> None:
        with contextlib.closing(connect(path)) as con, con.cursor() as cur:
            cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
            cur.execute(jobs[k][0].format(lo=lo, hi=hi))
            got[k] = arrow_stream.read_into(cur.fetch_arrow(), cols, nulls, first[k])

    for query, ranges in sources:  # a source's ranges at once
        done = sum(len(r) for _, r in sources[:sources.index((query, ranges))])
        _on_threads(ranges, lambda k, lo, hi: read(done + k, lo, hi))
    at = 0
    for k, n in enumerate(got):  # close up: each range's rows after the previous range's
        if first[k] != at:
            for c in cols:
                c[at:at + n] = c[first[k]:first[k] + n]
        at += n
    return [c[:at] for c in cols]
