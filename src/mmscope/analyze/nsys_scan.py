"""Read the NVTX_EVENTS rows of an nsys SQLite file fast: chunked, packed, on several processes.

Python pays per value fetched, so one integer carries textId, domainId and eventType, and the rare
or textual columns come back from SQLite as one string per chunk. Run as a module it is a worker.
"""
from __future__ import annotations

import itertools
import json
import os
import sqlite3
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass

import numpy as np

SEP = "\x1f"  # joins a chunk's texts into one string; a chunk with a text holding it is re-read
CHUNK_ROWS = 1 << 18
PARALLEL_MIN_ROWS = 1_500_000
COLUMNS = (("start", np.int64), ("end", np.int64), ("thread", np.int64), ("text_id", np.int64),
           ("event_type", np.int16), ("domain", np.int64))
# Packing limits: ((textId + 1) << 24) | (domainId << 8) | eventType must be exact.
MAX_TEXT_ID, MAX_DOMAIN, MAX_EVENT_TYPE = (1 << 38) - 2, (1 << 16) - 1, 255


@dataclass(frozen=True)
class Scan:
    """The file, its NVTX table and which optional columns that table has."""

    path: str
    table: str
    columns: tuple[str, ...]

    def col(self, name: str, default: str = "NULL") -> str:
        return name if name in self.columns else default

    def where(self) -> str:
        return f"FROM {self.table} WHERE rowid >= ? AND rowid < ? ORDER BY rowid"

    def packed_sql(self) -> str:
        """Rows with ((textId + 1) << 24) | (domainId << 8) | eventType, or -1 where that would
        not be exact (the chunk is then read again, plain)."""
        tid = f"coalesce({self.col('textId')}, -1)"
        dom = f"coalesce({self.col('domainId')}, 0)"
        return (f"SELECT start, coalesce({self.col('end')}, start - 1), "
                f"coalesce({self.col('globalTid', '0')}, 0), "
                f"CASE WHEN {tid} BETWEEN -1 AND {MAX_TEXT_ID} AND {dom} BETWEEN 0 AND "
                f"{MAX_DOMAIN} AND eventType BETWEEN 0 AND {MAX_EVENT_TYPE} "
                f"THEN (({tid} + 1) << 24) | ({dom} << 8) | eventType ELSE -1 END {self.where()}")

    def plain_sql(self) -> str:
        gtid = self.col("globalTid", "0")
        return (f"SELECT start, coalesce({self.col('end')}, start - 1), coalesce({gtid}, 0), "
                f"coalesce({self.col('textId')}, -1), eventType, "
                f"coalesce({self.col('domainId')}, 0), "
                f"coalesce({self.col('endGlobalTid')}, {gtid}, 0) {self.where()}")

    def side_sql(self) -> str:
        """Per chunk: row count and rowid span (positions), other-thread ends, any text at all."""
        egt, gtid = self.col("endGlobalTid"), self.col("globalTid")
        has_text = "max(length(text))" if "text" in self.columns else "NULL"
        return (f"SELECT count(*), min(rowid), max(rowid), "
                f"group_concat(CASE WHEN {egt} != {gtid} THEN rowid || ':' || {egt} END), "
                f"{has_text} FROM {self.table} WHERE rowid >= ? AND rowid < ?")

    def text_sql(self) -> str:
        # SQLite joins the chunk's texts in C, far cheaper than a Python string per row.
        return (f"SELECT group_concat(t, char(31)) FROM "
                f"(SELECT coalesce(text, '') AS t {self.where()})")


def scan(spec: Scan, lo: int, hi: int, workers: int | None = None,
         chunk_rows: int = CHUNK_ROWS) -> dict:
    """Columns of rowids [lo, hi); several processes when the table is large."""
    if workers is None:
        workers = default_workers() if hi - lo >= PARALLEL_MIN_ROWS else 1
    if workers <= 1 or hi - lo < 2 * chunk_rows:
        return read_range(spec, lo, hi, chunk_rows)
    step = -(-(hi - lo) // workers)
    spans = [(a, min(a + step, hi)) for a in range(lo, hi, step)]
    return _run_workers(spec, lo, hi, spans, chunk_rows)


def default_workers() -> int:
    """MMSCOPE_ANALYZE_WORKERS, else the cores that others leave idle (at most 4).

    On a shared machine a second worker on a busy core makes the scan slower, not faster.
    """
    env = os.environ.get("MMSCOPE_ANALYZE_WORKERS")
    if env:
        return max(1, int(env))
    cores = len(os.sched_getaffinity(0))
    idle = cores - os.getloadavg()[0]
    return max(1, min(round(idle), cores, 4))


def _allocate(n: int) -> dict:
    """Columns for up to n rows (rowids are dense in practice, so n is the row count)."""
    out = {name: np.empty(n, dt) for name, dt in COLUMNS}
    out["text_code"] = np.empty(n, np.int32)
    return out


def read_range(spec: Scan, lo: int, hi: int, chunk_rows: int = CHUNK_ROWS) -> dict:
    """Columns, other-thread ends and dictionary-coded texts of rowids [lo, hi), in rowid order."""
    out = _allocate(max(hi - lo, 0))
    texts: dict[str, int] = {"": 0}
    cross_pos, cross_thread, n = [], [], 0
    con = sqlite3.connect(f"file:{spec.path}?mode=ro", uri=True)
    try:
        for a in range(lo, hi, chunk_rows):
            part = _read_chunk(con, spec, a, min(a + chunk_rows, hi), texts)
            count = len(part["start"])
            for name in out:
                out[name][n:n + count] = part[name]
            cross_pos.append(part["cross_pos"] + n)
            cross_thread.append(part["cross_thread"])
            n += count
    finally:
        con.close()
    if n < hi - lo:  # gaps in the rowids: give the unused tail back
        out = {k: v[:n].copy() for k, v in out.items()}
    out["cross_pos"] = _cat(cross_pos, np.int64)
    out["cross_thread"] = _cat(cross_thread, np.int64)
    out["texts"] = list(texts)
    return out


def _cat(arrays: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)


def _read_chunk(con, spec: Scan, a: int, b: int, texts: dict[str, int]) -> dict:
    count, r0, r1, cross, text_len = con.execute(spec.side_sql(), (a, b)).fetchone()
    if count == 0:
        return _empty_part()
    part = _packed(con, spec, a, b, count) if r1 - r0 + 1 == count else None
    if part is not None:
        pos, val = _parse_cross(cross, r0)
    else:  # rowid gaps (positions unknown) or ids too large to pack
        part, pos, val = _plain(con, spec, a, b, count)
    part["cross_pos"], part["cross_thread"] = pos, val
    if text_len:
        part["text_code"] = _text_codes(con, spec, a, b, count, texts)
    else:
        part["text_code"] = np.zeros(count, np.int32)
    return part


def _fetch(con, sql: str, a: int, b: int, count: int, width: int) -> np.ndarray:
    # Straight from the cursor into numpy: no list of row tuples is ever held.
    flat = itertools.chain.from_iterable(con.execute(sql, (a, b)))
    return np.fromiter(flat, dtype=np.int64, count=count * width).reshape(count, width)


def _packed(con, spec: Scan, a: int, b: int, count: int) -> dict | None:
    rows = _fetch(con, spec.packed_sql(), a, b, count, 4)
    packed = rows[:, 3]
    if packed.min() < 0:
        return None
    # Column views of `rows`: read_range's concatenation makes them contiguous.
    return {"start": rows[:, 0], "end": rows[:, 1], "thread": rows[:, 2],
            "text_id": (packed >> 24) - 1, "event_type": (packed & 0xFF).astype(np.int16),
            "domain": (packed >> 8) & 0xFFFF}


def _plain(con, spec: Scan, a: int, b: int, count: int):
    rows = _fetch(con, spec.plain_sql(), a, b, count, 7)
    part = {"start": rows[:, 0], "end": rows[:, 1], "thread": rows[:, 2],
            "text_id": rows[:, 3], "event_type": rows[:, 4].astype(np.int16),
            "domain": rows[:, 5]}
    pos = np.flatnonzero(rows[:, 6] != rows[:, 2])
    return part, pos, rows[pos, 6].copy()


def _parse_cross(cross: str | None, r0: int):
    if not cross:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pairs = np.array([p.split(":") for p in cross.split(",")], dtype=np.int64)
    order = np.argsort(pairs[:, 0], kind="stable")
    return pairs[order, 0] - r0, pairs[order, 1]


def _text_codes(con, spec: Scan, a: int, b: int, count: int, texts) -> np.ndarray:
    parts = con.execute(spec.text_sql(), (a, b)).fetchone()[0].split(SEP)
    if len(parts) != count:  # a text holds the separator: read this chunk row by row
        parts = [r[0] for r in con.execute(f"SELECT coalesce(text, '') {spec.where()}", (a, b))]
    return np.fromiter((texts.setdefault(t, len(texts)) for t in parts), np.int32, len(parts))


def _empty_part() -> dict:
    part = {name: np.zeros(0, dt) for name, dt in COLUMNS}
    part.update(cross_pos=np.zeros(0, np.int64), cross_thread=np.zeros(0, np.int64),
                text_code=np.zeros(0, np.int32))
    return part


# --- worker processes -----------------------------------------------------------------------
# Plain subprocesses rather than multiprocessing: spawn would re-import the caller's main script.

ARRAYS = tuple(n for n, _ in COLUMNS) + ("text_code",)


def _run_workers(spec: Scan, lo: int, hi: int, spans: list[tuple[int, int]],
                 chunk_rows: int) -> dict:
    """Each worker streams its columns straight into its slice of one set of arrays."""
    out = _allocate(hi - lo)
    procs = [_start_worker(spec, a, b, chunk_rows) for a, b in spans]
    heads: list = [None] * len(procs)

    def collect(i: int) -> None:
        heads[i] = _receive(procs[i], out, spans[i][0] - lo)

    threads = [threading.Thread(target=collect, args=(i,)) for i in range(len(procs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _assemble(out, spans, lo, heads)


def _start_worker(spec: Scan, a: int, b: int, chunk_rows: int) -> subprocess.Popen:
    job = json.dumps({"spec": asdict(spec), "lo": a, "hi": b, "chunk_rows": chunk_rows})
    proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(job.encode())
    proc.stdin.close()
    return proc


def _receive(proc: subprocess.Popen, out: dict, offset: int) -> dict:
    """Read a worker's header and arrays into `out` at `offset`; errors come back in the dict."""
    line = proc.stdout.readline()
    if not line:
        err = proc.stderr.read().decode(errors="replace").strip().splitlines()
        proc.wait()
        return {"error": err[-1] if err else f"exit status {proc.returncode}"}
    head = json.loads(line)
    n = head["rows"]
    for name in ARRAYS:
        _read_exact(proc.stdout, memoryview(out[name][offset:offset + n]).cast("B"))
    head["cross_pos"] = np.frombuffer(proc.stdout.read(8 * head["cross"]), np.int64)
    head["cross_thread"] = np.frombuffer(proc.stdout.read(8 * head["cross"]), np.int64)
    proc.stderr.read()
    proc.wait()
    return head


def _read_exact(stream, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = stream.readinto(view[got:])
        if not k:
            raise RuntimeError("scan worker stopped early")
        got += k


def _assemble(out: dict, spans, lo: int, heads: list[dict]) -> dict:
    """Close the gaps between workers' slices, merge their text dictionaries, shift positions."""
    for h in heads:
        if "error" in h:
            if h["error"].startswith("sqlite3.DatabaseError:"):
                raise sqlite3.DatabaseError(h["error"].split(":", 1)[1].strip())
            raise RuntimeError(f"scan worker failed: {h['error']}")
    slices = [slice(a - lo, a - lo + h["rows"]) for (a, _), h in zip(spans, heads)]
    texts: dict[str, int] = {"": 0}
    for sl, h in zip(slices, heads):
        remap = np.array([texts.setdefault(t, len(texts)) for t in h["texts"]], np.int32)
        out["text_code"][sl] = remap[out["text_code"][sl]]
    if any(sl.stop != (b - lo) for sl, (_, b) in zip(slices, spans)):
        out = {k: np.concatenate([v[sl] for sl in slices]) for k, v in out.items()}
    starts = np.cumsum([0] + [h["rows"] for h in heads])
    out["cross_pos"] = _cat([h["cross_pos"] + s for h, s in zip(heads, starts)], np.int64)
    out["cross_thread"] = _cat([h["cross_thread"] for h in heads], np.int64)
    out["texts"] = list(texts)
    return out


def _worker_main() -> int:
    job = json.loads(sys.stdin.buffer.read())
    spec = Scan(**{**job["spec"], "columns": tuple(job["spec"]["columns"])})
    try:
        out = read_range(spec, job["lo"], job["hi"], job["chunk_rows"])
    except sqlite3.DatabaseError as e:
        print(f"sqlite3.DatabaseError: {e}", file=sys.stderr)
        return 3
    head = {"rows": len(out["start"]), "cross": len(out["cross_pos"]), "texts": out["texts"]}
    sink = sys.stdout.buffer
    sink.write(json.dumps(head).encode() + b"\n")
    for name in ARRAYS + ("cross_pos", "cross_thread"):
        sink.write(memoryview(np.ascontiguousarray(out[name])).cast("B"))
    sink.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())
