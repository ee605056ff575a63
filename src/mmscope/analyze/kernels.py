"""The analyzer's C kernels (`_analysis_kernels.c`) through ctypes, on numpy buffers.

`lib()` is None where the library was not built or MMSCOPE_ANALYZE_NO_C=1 asks for the numpy road.
"""
from __future__ import annotations

import ctypes
import glob
import mmap
import os

import numpy as np

_LIB: list = []  # [library or None], loaded once
I64, P = ctypes.c_int64, ctypes.c_void_p
ABI = 1  # mk_abi() of the C source these signatures describe


def lib():
    """The loaded library, or None (not built here, or disabled by MMSCOPE_ANALYZE_NO_C)."""
    if os.environ.get("MMSCOPE_ANALYZE_NO_C", "") not in ("", "0"):
        return None
    if not _LIB:
        _LIB.append(_load())
    return _LIB[0]


def _load():
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_analysis_kernels*.so")))
    if not found:
        return None
    try:
        c = ctypes.CDLL(found[0])
        c.mk_abi.restype = I64
        if c.mk_abi() != ABI:  # built from another version of the source: rebuild to use it
            return None
    except (OSError, AttributeError):
        return None
    c.mk_ctx_new.restype = P
    c.mk_ctx_free.argtypes = [P]
    c.mk_ctx_sizes.argtypes = [P, P]
    c.mk_ctx_copy.argtypes = [P, P, P, P, P]
    c.mk_count_cells.argtypes = [P, I64, P, I64, I64]
    c.mk_count_cells.restype = I64
    c.mk_decode.argtypes = [P, P, I64, P, I64, I64, I64, P, I64] + [P] * 7
    c.mk_decode.restype = I64
    c.mk_resolve.argtypes = [I64, P, P, P, I64, I64, I64, P]
    c.mk_nest.argtypes = [I64, P, P, P, P, ctypes.c_int8, P, P, P, P, I64, P, P]
    c.mk_nest.restype = I64
    c.mk_stage_stats.argtypes = [I64, I64] + [P] * 14
    c.mk_stage_stats.restype = I64
    c.mk_overlaps.argtypes = [I64, P, P, P, P]
    c.mk_overlaps.restype = I64
    c.mk_latest_before.argtypes = [I64, P, I64, P, P, P, P, P]
    c.mk_latest_before.restype = I64
    c.mk_distinct.argtypes = [I64, P, I64, P]
    c.mk_distinct.restype = I64
    c.mk_parse_step_meta.argtypes = [ctypes.c_char_p, I64, I64, P]
    c.mk_parse_step_meta.restype = I64
    c.mk_rows_by_slot.argtypes = [I64, P, P, I64, P, P]
    return c


class Background:
    """fn(*args) on another thread; result() waits and returns it, or raises what it raised.
    For the kernels: a ctypes call drops the GIL, so C runs beside this thread's Python."""

    def __init__(self, fn, *args):
        import threading

        self._out: list = []
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self._thread.start()

    def _run(self, fn, args):
        try:
            self._out.append((True, fn(*args)))
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            self._out.append((False, e))

    def result(self):
        self._thread.join()
        ok, value = self._out[0]
        if not ok:
            raise value
        return value


def ptr(a: np.ndarray | None):
    return None if a is None else a.ctypes.data


def c_array(a: np.ndarray, dtype) -> np.ndarray:
    """a as a C-contiguous array of dtype (no copy where it already is one)."""
    return np.ascontiguousarray(a, dtype=dtype)


def fresh_zeros(n: int, dtype) -> np.ndarray:
    """np.zeros from pages of their own: the kernel's zero pages, touched only where written
    (np.zeros may reuse freed heap memory and clear all of it)."""
    size = max(n * np.dtype(dtype).itemsize, 1)
    return np.frombuffer(mmap.mmap(-1, size), dtype, n)


PARALLEL_LEAVES = 256  # fewer leaf pages than this are decoded on one thread


def decode_leaves(file: np.ndarray, leaves: np.ndarray, page_size: int, usable: int,
                  fields: list[int]):
    """The columns of nsys_pages' output from these leaf pages of the mapped file, and the
    (offset, length) of each distinct text by code (code 0 is ""); None where the file holds
    something the C decoder does not take (the caller reads it through SQLite). Two
    shortcuts: "text_code" is None where no row has a text, and "domains_all_zero" says so.

    Two threads decode the two halves of the leaves into their rows of the same arrays; the
    second half's text codes are then renumbered into the first's dictionary."""
    c = lib()
    leaves = c_array(leaves, np.int64)
    parts = np.array_split(leaves, 2) if len(leaves) >= PARALLEL_LEAVES else [leaves]
    counts = [c.mk_count_cells(ptr(file), len(file), ptr(p), len(p), page_size) for p in parts]
    if min(counts) < 0:
        return None
    n_max = sum(counts)
    cols = {"start": np.empty(n_max, np.int64), "end": np.empty(n_max, np.int64),
            "thread": np.empty(n_max, np.int64), "text_id": np.empty(n_max, np.int64),
            "event_type": np.empty(n_max, np.int16),
            # Zeroed, and written only where not 0: pages of all-zero columns are never touched.
            "domain": fresh_zeros(n_max, np.int64), "text_code": fresh_zeros(n_max, np.int32)}
    want = np.array(fields, np.int64)
    row0 = np.cumsum([0] + counts[:-1]).tolist()

    def part(k: int):
        ctx = c.mk_ctx_new()
        if not ctx:
            raise MemoryError
        try:
            at = {name: a.ctypes.data + row0[k] * a.itemsize for name, a in cols.items()}
            n = c.mk_decode(ctx, ptr(file), len(file), ptr(parts[k]), len(parts[k]), page_size,
                            usable, ptr(want), counts[k], *(at[name] for name in (
                                "start", "end", "thread", "text_id", "event_type", "domain",
                                "text_code")))
            if n == -2:
                raise MemoryError
            if n != counts[k]:
                return None
            sizes = np.zeros(3, np.int64)
            c.mk_ctx_sizes(ctx, ptr(sizes))
            toff, tlen = np.empty(sizes[0], np.int64), np.empty(sizes[0], np.int32)
            xpos, xthr = np.empty(sizes[1], np.int64), np.empty(sizes[1], np.int64)
            c.mk_ctx_copy(ctx, ptr(toff), ptr(tlen), ptr(xpos), ptr(xthr))
            return toff, tlen, xpos + row0[k], xthr, int(sizes[2])
        finally:
            c.mk_ctx_free(ctx)

    other = Background(part, 1) if len(parts) > 1 else None
    got = [part(0)] + ([other.result()] if other is not None else [])
    if any(g is None for g in got):
        return None
    toff, tlen = _merge_texts(file, cols["text_code"], got, row0)
    cols["cross_pos"] = np.concatenate([g[2] for g in got])
    cols["cross_thread"] = np.concatenate([g[3] for g in got])
    if len(toff) == 0:
        cols["text_code"] = None  # no texts: every code 0, and the zero pages stay unread
    cols["domains_all_zero"] = sum(g[4] for g in got) == 0
    return cols, toff, tlen


def _merge_texts(file: np.ndarray, codes: np.ndarray, got: list, row0: list[int]):
    """One dictionary of texts, first appearance first, from the parts' own: a later part's
    codes are renumbered (its texts seen before take their earlier codes)."""
    toff, tlen = list(got[0][0].tolist()), list(got[0][1].tolist())
    if all(len(g[0]) == 0 for g in got[1:]):
        return got[0][0], got[0][1]
    seen = {file[o:o + k].tobytes(): i + 1 for i, (o, k) in enumerate(zip(toff, tlen))}
    for g, r0, r1 in zip(got[1:], row0[1:], row0[2:] + [len(codes)]):
        new = np.zeros(len(g[0]) + 1, np.int32)  # code 0 ("" and NULL) stays 0
        for j, (o, k) in enumerate(zip(g[0].tolist(), g[1].tolist())):
            key = file[o:o + k].tobytes()
            if key not in seen:
                seen[key] = len(toff) + 1
                toff.append(o)
                tlen.append(k)
            new[j + 1] = seen[key]
        codes[r0:r1] = new[codes[r0:r1]]
    return np.array(toff, np.int64), np.array(tlen, np.int32)


def resolve(text_id: np.ndarray, text_code: np.ndarray | None, table: np.ndarray, lo: int,
            n_ids: int) -> np.ndarray:
    """nsys._resolve_names' dense lookup: table[text_id - lo] where set, else n_ids + code;
    over text_id itself where that is a C int64 array (the caller gives it up)."""
    text_id = c_array(text_id, np.int64)
    out = text_id  # in place: each row reads its id, then writes its code
    codes = None if text_code is None else c_array(text_code, np.int32)
    table = c_array(table, np.int64)
    lib().mk_resolve(len(text_id), ptr(text_id), ptr(codes), ptr(table), lo, len(table), n_ids,
                     ptr(out))
    return out


def nest(thread, sub, start, end, depth, parent, order=None, gid=None, n_groups=0,
         domain_kind=None) -> bool:
    """Fill depth and parent (table.nest's rule); False where the rows must be sorted first
    (only without `order`). `domain_kind` = (domain_id, kind, START_END) stands for
    sub = (domain_id << 1) | (kind == START_END), without that array."""
    thread, start, end = (c_array(a, np.int64) for a in (thread, start, end))
    sub = None if sub is None else c_array(sub, np.int32)
    domain = kind = None
    start_end = 0
    if domain_kind is not None:
        domain, kind, start_end = domain_kind
        domain, kind = c_array(domain, np.int32), c_array(kind, np.int8)
    rc = lib().mk_nest(len(start), ptr(thread), ptr(sub), ptr(domain), ptr(kind), start_end,
                       ptr(start), ptr(end), ptr(order), ptr(gid), n_groups, ptr(depth),
                       ptr(parent))
    if rc == -2:
        raise MemoryError
    return rc == 0


def stage_stats(name_id: np.ndarray, stage_of: np.ndarray, start, end, parent,
                n_stages: int) -> dict:
    """Per stage (a row's is stage_of[name_id]) count/total/min/max, child_sum/pairs/
    parent_total/usual (see the C), and "grouped": the durations by stage, each stage's in row
    order."""
    name_id, stage_of = c_array(name_id, np.int32), c_array(stage_of, np.int32)
    start, end, parent = (c_array(a, np.int64) for a in (start, end, parent))
    n = len(name_id)
    out = {k: np.empty(n_stages, np.int64) for k in (
        "count", "total", "min", "max", "child_sum", "pairs", "parent_total", "usual")}
    grouped = np.empty(n, np.int64)
    rc = lib().mk_stage_stats(n, n_stages, ptr(name_id), ptr(stage_of), ptr(start), ptr(end),
                              ptr(parent),
                              *(ptr(out[k]) for k in ("count", "total", "min", "max")),
                              ptr(grouped),
                              *(ptr(out[k]) for k in ("child_sum", "pairs", "parent_total",
                                                      "usual")))
    if rc < 0:
        raise MemoryError
    out["grouped"] = grouped
    return out


def overlaps(rows, thread, start, end) -> int | None:
    """checks._overlapping's count, or None where a thread's rows are not in start order."""
    rows, thread, start, end = (c_array(a, np.int64) for a in (rows, thread, start, end))
    got = lib().mk_overlaps(len(rows), ptr(rows), ptr(thread), ptr(start), ptr(end))
    if got == -2:
        raise MemoryError
    return None if got < 0 else int(got)


def latest_before(outer, inner, thread, start, end=None) -> np.ndarray | None:
    """table.latest_before's answer (with `end`: checks._inside's), or None where a thread's
    outer rows are not in start order."""
    outer, inner, thread, start = (c_array(a, np.int64) for a in (outer, inner, thread, start))
    end = None if end is None else c_array(end, np.int64)
    found = np.empty(len(inner), np.int64)
    rc = lib().mk_latest_before(len(outer), ptr(outer), len(inner), ptr(inner), ptr(thread),
                                ptr(start), ptr(end), ptr(found))
    if rc == -2:
        raise MemoryError
    return None if rc < 0 else found


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted (for columns with few of them: threads, processes)."""
    values = c_array(values, np.int64)
    out = np.empty(64, np.int64)
    got = lib().mk_distinct(len(values), ptr(values), len(out), ptr(out))
    if got > len(out):
        out = np.empty(got, np.int64)
        got = lib().mk_distinct(len(values), ptr(values), len(out), ptr(out))
    if got < 0:
        raise MemoryError
    return np.sort(out[:got])


def parse_step_meta(text: str, n_lines: int) -> np.ndarray | None:
    """steps._parse_joined's numbers per line of an ASCII text (see the C), or None where a
    number is too long or the lines are not n_lines."""
    data = text.encode("ascii")
    out = np.empty((n_lines, 4), np.int64)
    if lib().mk_parse_step_meta(data, len(data), n_lines, ptr(out)) != 0:
        return None
    return out


def rows_by_slot(name_id: np.ndarray, slot_of: np.ndarray, n_slots: int) -> list[np.ndarray]:
    """For each slot, the rows whose name id maps to it (slot_of[id]; -1: none), in row order."""
    name_id, slot_of = c_array(name_id, np.int32), c_array(slot_of, np.int32)
    counts = np.zeros(n_slots, np.int64)
    lib().mk_rows_by_slot(len(name_id), ptr(name_id), ptr(slot_of), n_slots, ptr(counts), None)
    rows = np.empty(int(counts.sum()), np.int64)
    lib().mk_rows_by_slot(len(name_id), ptr(name_id), ptr(slot_of), n_slots, ptr(counts),
                          ptr(rows))
    return np.split(rows, np.cumsum(counts)[:-1])

