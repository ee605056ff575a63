"""Reads the spool files that the injection library (nvtx_inject.c) writes, one per process.

Each gives its header, metadata (strings, domains, categories, thread names, clock pairs) and events.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field

import numpy as np

# Mirrors mm_rec in nvtx_inject.c.
RECORD = np.dtype([
    ("start", "<u8"), ("aux", "<u8"), ("payload", "<u8"),
    ("text", "<u4"), ("color", "<u4"), ("category", "<u4"), ("domain", "<u4"),
    ("kind", "u1"), ("msgtype", "u1"), ("ptype", "u1"), ("colortype", "u1"), ("level", "<u4"),
])
PUSH, START, END, MARK, POPLATE = 1, 2, 3, 4, 5
MSG_ASCII, MSG_UNICODE, MSG_REGISTERED = 1, 2, 3

FILE_MAGIC = b"MMSPOOL1"
FILE_HEADER = 4096
REGION_HEADER = 64
REGION_MAGIC = 0x4B434D4D
RING, META, COPY, COPYING = 1, 2, 3, 4
META_STRING, META_DOMAIN, META_CATEGORY, META_THREAD, META_CALIB = 1, 2, 3, 4, 5
PAGE = 4096


class SpoolError(ValueError):
    """A spool file that is not one, or is damaged beyond its header."""


@dataclass
class Process:
    path: str
    pid: int
    ppid: int
    tsc: bool
    comm: str
    cmdline: list[str]
    pairs: list[tuple[int, int]] = field(default_factory=list)  # (ticks, CLOCK_MONOTONIC_RAW ns)
    strings: dict[int, str] = field(default_factory=dict)
    domains: list[tuple[int, int, int, int]] = field(default_factory=list)  # id, name sid, tid, ticks
    categories: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # dom, cat, sid, tid, ticks
    thread_names: list[tuple[int, int, int, int]] = field(default_factory=list)  # tid, sid, source, ticks
    events: np.ndarray = field(default_factory=lambda: np.zeros(0, RECORD))
    tids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))


@dataclass
class _Ring:
    tid: int
    capacity: int
    head: int
    slots: np.ndarray
    copies: list[tuple[int, np.ndarray]] = field(default_factory=list)


def read_spool(path: str) -> Process:
    """Parses one spool file; regions after a damaged one are found again at the next page."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < FILE_HEADER:
            raise SpoolError(f"{path}: too short for a spool file")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    proc = _header(path, buf)
    rings: dict[int, _Ring] = {}
    copies: list[tuple[int, int, int, np.ndarray]] = []
    off = FILE_HEADER
    while off + REGION_HEADER <= size:
        magic, rtype, tid, _, cap, rsize, head, ring_id, first, count = struct.unpack_from(
            "<IIIIQQQQQQ", buf, off)
        if magic != REGION_MAGIC or rsize < REGION_HEADER or off + rsize > size:
            off += PAGE  # a region reserved but never written: regions start on page boundaries
            continue
        body = off + REGION_HEADER
        if rtype == RING:
            slots = np.frombuffer(buf, RECORD, count=cap, offset=body)
            rings[ring_id] = _Ring(tid, cap, head, slots)
        elif rtype == COPY:
            copies.append((ring_id, tid, first, np.frombuffer(buf, RECORD, count=count, offset=body)))
        elif rtype == META:
            _meta(proc, buf, body, off + rsize)
        off += rsize
    for ring_id, tid, first, recs in copies:
        if ring_id not in rings:  # an exited thread's ring, since handed to another thread
            rings[ring_id] = _Ring(tid, 0, 0, np.zeros(0, RECORD))
        ring = rings[ring_id]
        ring.copies.append((first, recs))
        if not ring.capacity:
            ring.head = max(ring.head, first + len(recs))
    _collect(proc, rings.values())
    return proc


def _header(path: str, buf) -> Process:
    if buf[:8] != FILE_MAGIC:
        raise SpoolError(f"{path}: not an mmscope spool file")
    _, _, pid, ppid, tsc, recsize, ticks, ns = struct.unpack_from("<IIIIIIQQ", buf, 8)
    if recsize != RECORD.itemsize:
        raise SpoolError(f"{path}: record size {recsize}, expected {RECORD.itemsize}")
    comm = bytes(buf[64:124]).split(b"\0", 1)[0].decode("utf-8", "replace")
    (clen,) = struct.unpack_from("<I", buf, 124)
    cmdline = [a.decode("utf-8", "replace") for a in bytes(buf[128:128 + clen]).split(b"\0") if a]
    return Process(path, pid, ppid, bool(tsc), comm, cmdline, pairs=[(ticks, ns)])


def _meta(proc: Process, buf, off: int, end: int) -> None:
    while off + 8 <= end:
        etype, length = struct.unpack_from("<HxxI", buf, off)
        if etype == 0 or off + 8 + length > end:
            return
        body = off + 8
        if etype == META_STRING:
            (sid,) = struct.unpack_from("<I", buf, body)
            proc.strings[sid] = bytes(buf[body + 4:body + length]).decode("utf-8", "replace")
        elif etype == META_DOMAIN:
            did, sid, tid, _, lo, hi = struct.unpack_from("<6I", buf, body)
            proc.domains.append((did, sid, tid, lo | hi << 32))
        elif etype == META_CATEGORY:
            dom, cat, sid, tid, lo, hi = struct.unpack_from("<6I", buf, body)
            proc.categories.append((dom, cat, sid, tid, lo | hi << 32))
        elif etype == META_THREAD:
            tid, sid, source, _, lo, hi = struct.unpack_from("<6I", buf, body)
            proc.thread_names.append((tid, sid, source, lo | hi << 32))
        elif etype == META_CALIB:
            proc.pairs.append(struct.unpack_from("<QQ", buf, body))
        off += (8 + length + 7) & ~7


def _ring_events(ring: _Ring) -> np.ndarray:
    """All records of one ring in sequence order: the copies, then what the ring still holds.

    The ring is authoritative for its newest records (the segment being filled is updated in
    place). The slot of seq head - capacity may be half overwritten by a record that was being
    written when the process died, but only once that seq is copied (the writer waits for it):
    with a complete copy holding it, the ring is read from the next seq; without one (the ring
    filled exactly to capacity while the copier lagged, or that copy was cut off by the exit),
    the slot is intact and the only place the record is.
    Copies are moved as raw bytes: numpy copies structured arrays field by field.
    """
    size = RECORD.itemsize
    raw = np.zeros(ring.head * size, np.uint8)
    for first, recs in ring.copies:
        n = max(0, min(len(recs), ring.head - first))
        raw[first * size:(first + n) * size] = recs[:n].view(np.uint8)
    slots = ring.slots.view(np.uint8)
    edge = ring.head - ring.capacity
    copied = any(first <= edge < first + len(recs) for first, recs in ring.copies)
    lo = max(0, edge + 1 if copied else edge)
    n, a = max(0, ring.head - lo), lo & max(0, ring.capacity - 1)
    if not ring.capacity:
        pass
    elif a + n <= ring.capacity:
        raw[lo * size:ring.head * size] = slots[a * size:(a + n) * size]
    else:
        n1 = ring.capacity - a
        raw[lo * size:(lo + n1) * size] = slots[a * size:]
        raw[(lo + n1) * size:ring.head * size] = slots[:(n - n1) * size]
    out = raw.view(RECORD)
    kind = out["kind"]
    late = np.flatnonzero(kind == POPLATE)
    if len(late):
        target = out["aux"][late].astype(np.int64)
        ok = (target < len(out)) & (kind[np.minimum(target, len(out) - 1)] == PUSH)
        out["aux"][target[ok]] = out["start"][late[ok]]
    keep = (kind >= PUSH) & (kind <= MARK)
    return out if keep.all() else out[keep]


def _collect(proc: Process, rings) -> None:
    parts, tids = [], []
    for ring in rings:
        ev = _ring_events(ring)
        parts.append(ev)
        tids.append(np.full(len(ev), ring.tid, np.uint32))
    if len(parts) == 1:
        proc.events, proc.tids = parts[0], tids[0]
    elif parts:
        proc.events = np.concatenate([p.view(np.uint8) for p in parts]).view(RECORD)
        proc.tids = np.concatenate(tids)


def read_spool_dir(directory: str) -> list[Process]:
    """Every process's spool in `directory`, in pid order."""
    paths = sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".mmspool"))
    return sorted((read_spool(p) for p in paths), key=lambda p: (p.pairs[0][1], p.pid))
