"""Load the SQLite file of `nsys export --type sqlite` (or `mmscope record`) into a RangeTable.

Both schema eras (text vs textId -> StringIds, with or without eventId); per-process domains.
"""
from __future__ import annotations

import os
import re
import sqlite3

import numpy as np

from mmscope.analyze import kernels, nsys_pages, nsys_scan
from mmscope.analyze import table as tbl
from mmscope.errors import UserError

SQLITE_MAGIC = b"SQLite format 3\x00"
# NVIDIA's documented ids, used when a file has no ENUM_NSYS_EVENT_TYPE table.
DEFAULT_TYPES = {"NvtxCategory": 33, "NvtxMark": 34, "NvtxThread": 39, "NvtxPushPopRange": 59,
                 "NvtxStartEndRange": 60, "NvtxtPushPopRange": 70, "NvtxtStartEndRange": 71,
                 "NvtxDomainCreate": 75}
KIND_OF_TYPE = {"NvtxPushPopRange": tbl.PUSH_POP, "NvtxtPushPopRange": tbl.PUSH_POP,
                "NvtxStartEndRange": tbl.START_END, "NvtxtStartEndRange": tbl.START_END,
                "NvtxMark": tbl.MARK}
PID_BITS = 0xFFFFFF000000  # the pid part of a globalTid, as NVIDIA's reports join domains


def is_sqlite(head: bytes) -> bool:
    return head.startswith(SQLITE_MAGIC)


def load(path: str, workers: int | None = None,
         chunk_rows: int = nsys_scan.CHUNK_ROWS) -> tbl.RangeTable:
    """The RangeTable of an nsys SQLite export; bad files raise UserError with one line."""
    try:
        return _load(path, workers, chunk_rows)
    except sqlite3.DatabaseError as e:
        raise UserError(f"{path}: not a readable SQLite database ({e})") from None


def _connect(path: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _load(path: str, workers: int | None, chunk_rows: int) -> tbl.RangeTable:
    con = _connect(path)
    reader = None
    try:
        name = _nvtx_table(con, path)
        cols = tuple(r[1] for r in con.execute(f"PRAGMA table_info({name})"))
        pages = _page_layout(con, name, workers)
        if pages is not None and kernels.lib() is not None:
            # The C decoder runs without the GIL: the small tables are read meanwhile.
            reader = kernels.Background(_read_pages, path, pages)
        types = _event_types(con)
        strings = _string_ids(con)
        spec = nsys_scan.Scan(path, name, cols)
        # Two queries: SQLite answers a lone min() or max() of rowid from the b-tree's edge.
        lo = con.execute(f"SELECT min(rowid) FROM {name}").fetchone()[0]
        hi = con.execute(f"SELECT max(rowid) FROM {name}").fetchone()[0]
        thread_names = _thread_names_table(con, strings)
        process_names = _process_names(con)
    finally:
        con.close()
    # While the pages are decoded (the longer task): the registered names, canonical already.
    registered = _Registered(strings)
    if reader is not None:
        raw = reader.result()
    else:
        raw = _read_pages(path, pages) if pages is not None else None
    if raw is None and lo is None:
        raw = nsys_scan.read_range(spec, 0, 0)
    elif raw is None:
        raw = nsys_scan.scan(spec, lo, hi + 1, workers, chunk_rows)
    return _to_table(raw, types, registered, thread_names, process_names)


class _Registered:
    """StringIds in id order, and their canonical names (the texts of old-schema rows follow)."""

    def __init__(self, strings: dict[int, str]):
        self.ids = np.array(sorted(strings), dtype=np.int64)
        self.names = [strings[i] for i in self.ids.tolist()]
        self.canonical = tbl.canonical_prefix(self.names)


def _page_layout(con, name: str, workers: int | None):
    """Where the page reader finds the table, or None: asked for SQLite scan workers (argument
    or MMSCOPE_ANALYZE_WORKERS), or a table whose records it does not decode."""
    if workers is not None or os.environ.get("MMSCOPE_ANALYZE_WORKERS"):
        return None
    return nsys_pages.layout(con, name)


def _read_pages(path: str, pages) -> dict | None:
    try:
        return nsys_pages.read(path, pages)
    except nsys_pages.Unsupported:
        return None  # something SQLite decodes and the page reader does not: read through SQLite


def _nvtx_table(con: sqlite3.Connection, path: str) -> str:
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    # nsys-ai reports versioned names (NVTX_EVENTS_V2...) in some exports: accept them too.
    found = sorted(n for n in names if re.fullmatch(r"NVTX_EVENTS(_V\d+)?", n))
    if not found:
        raise UserError(f"{path}: SQLite file without an NVTX_EVENTS table (no NVTX ranges were "
                        "captured: profile with `nsys profile -t nvtx ...`)")
    return found[0]


def _event_types(con: sqlite3.Connection) -> dict[int, str]:
    """event type id -> NVIDIA's name, looked up by name where the file has the enum table."""
    types = {v: k for k, v in DEFAULT_TYPES.items()}
    try:
        rows = con.execute("SELECT id, name FROM ENUM_NSYS_EVENT_TYPE").fetchall()
    except sqlite3.OperationalError:
        return types
    by_name = {name: i for i, name in rows if name in DEFAULT_TYPES}
    if by_name:
        types = {i: name for name, i in by_name.items()}
    return types


def _string_ids(con: sqlite3.Connection) -> dict[int, str]:
    try:
        return dict(con.execute("SELECT id, value FROM StringIds"))
    except sqlite3.OperationalError:
        return {}


def _thread_names_table(con, strings: dict[int, str]) -> dict[int, str]:
    try:
        rows = con.execute("SELECT globalTid, nameId FROM ThreadNames ORDER BY priority").fetchall()
    except sqlite3.OperationalError:
        return {}
    return {int(t): strings[n] for t, n in rows if t is not None and n in strings}


def _process_names(con) -> dict[int, str]:
    try:
        rows = con.execute("SELECT pid, name FROM PROCESSES").fetchall()
    except sqlite3.OperationalError:
        return {}
    return {int(p): n for p, n in rows if p is not None and n}


def _to_table(raw: dict, types: dict[int, str], registered: "_Registered",
              thread_names: dict[int, str], process_names: dict[int, str]) -> tbl.RangeTable:
    """Resolve names, domains and kinds; metadata rows leave. Consumes `raw` to save memory."""
    event_type = raw.pop("event_type")
    names, name_code = _resolve_names(raw.pop("text_id"), raw.pop("text_code"), raw["texts"],
                                      registered)
    kind_of = {i: KIND_OF_TYPE[n] for i, n in types.items() if n in KIND_OF_TYPE}
    kind = _kinds(event_type, kind_of)  # -1: a metadata row
    # Thread names and domain creates are metadata rows: where there are none, no search.
    has_meta = bool(len(kind)) and int(kind.min()) < 0
    meta_rows = np.flatnonzero(kind < 0) if has_meta else np.zeros(0, np.int64)
    meta = (raw, event_type, meta_rows, types, names, name_code)
    thread_names = {**_thread_name_events(*meta), **thread_names}
    domain_names = _domain_names(*meta)
    cross_pos, cross_thread = raw.pop("cross_pos"), raw.pop("cross_thread")
    end_thread = raw["thread"]  # shared where no range ends on another thread
    if len(cross_pos):
        end_thread = end_thread.copy()
        end_thread[cross_pos] = cross_thread
    domains_all_zero = raw.pop("domains_all_zero", False)  # the C decoder knows it
    cols = {"start": raw.pop("start"), "end": raw.pop("end"), "thread": raw.pop("thread"),
            "name": name_code, "end_thread": end_thread}
    if not domains_all_zero:
        cols["domain"] = raw.pop("domain")
    del name_code, end_thread
    del event_type, meta, meta_rows
    if has_meta:  # metadata rows (domains, thread names, categories) leave the table
        rows = np.flatnonzero(kind >= 0)
        shared = cols["end_thread"] is cols["thread"]
        cols = {k: v[rows] for k, v in cols.items() if not (shared and k == "end_thread")}
        if shared:
            cols["end_thread"] = cols["thread"]
        kind = kind[rows]
    if domains_all_zero:
        domain_id, domains = np.zeros(len(kind), np.int32), [""]
    else:
        domain_id, domains = _domain_ids(cols["thread"], cols.pop("domain"), domain_names)
    return tbl.build(raw_names=names, name_id=cols.pop("name"), start=cols.pop("start"),
                     end=cols.pop("end"), kind=kind, thread=cols.pop("thread"),
                     end_thread=cols.pop("end_thread"), domain_id=domain_id, domains=domains,
                     thread_names=thread_names, process_names=process_names,
                     source="nsys-sqlite", canonical=registered.canonical)


def _resolve_names(text_id: np.ndarray, text_codes, texts: list[str], registered: _Registered):
    """Name per row: the registered string (textId -> StringIds) if any, else the text."""
    ids = registered.ids
    names = registered.names + list(texts)

    def fallback():
        return len(ids) + (text_codes.astype(np.int64) if text_codes is not None
                           else np.zeros(len(text_id), np.int64))

    if len(ids) == 0:
        return names, fallback()
    lo, span = int(ids[0]), int(ids[-1]) - int(ids[0]) + 1
    if span > max(4 * len(ids), 1 << 20):  # sparse ids: search them
        pos = np.minimum(np.searchsorted(ids, text_id), len(ids) - 1)
        return names, np.where(ids[pos] == text_id, pos, fallback())
    # Dense ids (nsys numbers its strings 1, 2, ...): one table lookup per row.
    table = np.full(span, -1, np.int64)
    table[ids - lo] = np.arange(len(ids))
    if kernels.lib() is not None:
        return names, kernels.resolve(text_id, text_codes, table, lo, len(ids))
    at = text_id - lo
    outside = (at < 0) | (at >= span)
    at[outside] = 0
    pos = table[at]
    del at
    pos[outside] = -1
    del outside
    missing = pos < 0
    pos[missing] = fallback()[missing]
    return names, pos


def _kinds(event_type: np.ndarray, kind_of: dict[int, int]) -> np.ndarray:
    """The range kind of each int16 event type, -1 for the others: one lookup per row (types
    outside int16 never match, as the SQL readers' int16 event types cannot hold them)."""
    table = np.full(1 << 16, -1, np.int8)
    for type_id, k in kind_of.items():
        if -(1 << 15) <= type_id < (1 << 15):
            table[type_id & 0xFFFF] = k
    return table[event_type.view(np.uint16)]


def _thread_name_events(raw, event_type, meta_rows, types, names, name_code) -> dict[int, str]:
    ids = [i for i, n in types.items() if n == "NvtxThread"]
    rows = meta_rows[np.isin(event_type[meta_rows], ids)]
    return {int(raw["thread"][r]): names[int(name_code[r])] for r in rows}


def _domain_names(raw, event_type, meta_rows, types, names,
                  name_code) -> dict[tuple[int, int], str]:
    """(pid bits, domainId) -> name; the first create of a domain in a process wins."""
    ids = [i for i, n in types.items() if n == "NvtxDomainCreate"]
    rows = meta_rows[np.isin(event_type[meta_rows], ids)]
    rows = rows[np.argsort(raw["start"][rows], kind="stable")]
    out: dict[tuple[int, int], str] = {}
    for r in rows:
        key = (int(raw["thread"][r]) & PID_BITS, int(raw["domain"][r]))
        out.setdefault(key, names[int(name_code[r])])
    return out


def _domain_ids(thread: np.ndarray, domain: np.ndarray, names: dict[tuple[int, int], str]):
    """Domain name index per row: "" for domain 0, the created name, or "domain N" if unnamed."""
    domain_id = np.zeros(len(thread), np.int32)
    if not domain.any():
        return domain_id, [""]
    index = {"": 0}
    pid = thread & PID_BITS
    for d in np.unique(domain[domain != 0]).tolist():
        in_d = domain == d
        for p in np.unique(pid[in_d]).tolist():
            name = names.get((p, d), f"domain {d}")
            domain_id[in_d & (pid == p)] = index.setdefault(name, len(index))
    return domain_id, list(index)
