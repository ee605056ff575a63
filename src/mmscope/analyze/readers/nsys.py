"""Load the SQLite file of `nsys export --type sqlite` (or `mmscope record`) into a RangeTable.

Read through DuckDB's SQLite scanner; both schema eras (text vs textId -> StringIds, with or
without eventId); per-process domains; the session's start on the UTC clock; the GPU work of
the CUPTI tables (cupti.py).
"""
from __future__ import annotations

import numpy as np

from mmscope.analyze.readers import cupti, sqlite_source
from mmscope.analyze.ranges import sql
from mmscope.analyze.ranges import table as tbl
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
# Kinds of the metadata rows, which leave the table once read (below the range kinds).
OTHER, THREAD_NAME, DOMAIN_CREATE = -1, -2, -3
META_KINDS = {"NvtxThread": THREAD_NAME, "NvtxDomainCreate": DOMAIN_CREATE}


def is_sqlite(head: bytes) -> bool:
    return head.startswith(SQLITE_MAGIC)


def load(path: str, workers: int | None = None) -> tbl.RangeTable:
    """The RangeTable of an nsys SQLite export; bad files raise UserError with one line.
    `workers`: DuckDB's threads (default: one per core)."""
    import duckdb

    try:
        with sqlite_source.readable(path) as readable:
            con = sqlite_source.connect(readable, workers)
            try:
                found = _read(con, path)
            finally:
                con.close()  # DuckDB holds the last result until then: free it before the build
        work, why = found[-1]
        table = _to_table(*found[:-1])
        table.device, table.no_device = work, why
        return table
    except (duckdb.Error, UnicodeDecodeError, SystemError) as e:
        # A corrupt file breaks the SQLite reader, or hands back text that is no UTF-8 (which
        # DuckDB's numpy conversion reports as a SystemError over the UnicodeDecodeError).
        if isinstance(e, SystemError) and not isinstance(e.__context__, UnicodeDecodeError):
            raise
        cause = e.__context__ if isinstance(e, SystemError) else e
        why = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise UserError(f"{path}: not a readable SQLite database ({why})") from None


def _read(con, path: str) -> tuple:
    """What _to_table takes, read from the file."""
    tables = {r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = 'db'").fetchall()}
    name = _nvtx_table(tables, path)
    cols = {r[0] for r in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE database_name = 'db' AND table_name = ?",
        [name]).fetchall()}
    strings = _string_ids(con, tables)
    small = (_thread_names_table(con, tables, strings), _process_names(con, tables),
             _session_clock(con, tables))
    raw = _read_events(con, name, cols, _event_types(con, tables))
    return (raw, _Registered(strings), *small, cupti.read(con, tables, strings))


def _q(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _read_events(con, name: str, cols: set[str], types: dict[int, str]) -> dict:
    """The columns of every NVTX row in rowid order (DuckDB keeps the scan's order), as narrow
    as they can be (each column costs its width again on the way into numpy): NULLs replaced
    (a missing end reads as start - 1: build() takes an end before the start as none), the
    kind of each row decided by its event type, and the texts dictionary-coded."""
    def column(col: str, expr: str, default: str) -> str:
        return expr if col in cols else default

    kinds = {i: KIND_OF_TYPE.get(n, META_KINDS.get(n)) for i, n in types.items()}
    cases = " ".join(f"WHEN {i} THEN {k}" for i, k in sorted(kinds.items()) if k is not None)
    exprs = {
        "start": column("start", "coalesce(start, 0)", "0"),
        "end": column("end", 'coalesce("end", coalesce(start, 0) - 1)', "coalesce(start, 0) - 1"),
        "thread": column("globalTid", "coalesce(globalTid, 0)", "0"),
        "text_id": column("textId", "coalesce(textId, -1)", "-1"),
        "kind": column("eventType", f"CAST(CASE eventType {cases} ELSE {OTHER} END AS TINYINT)",
                       f"CAST({OTHER} AS TINYINT)"),
        "domain": column("domainId", "CAST(coalesce(domainId, 0) AS INTEGER)", "0"),
        "crosses": column("endGlobalTid", "coalesce(endGlobalTid != globalTid, false)", "false"),
        "has_text": column("text", "text IS NOT NULL", "false")}
    out = sql.columns(con, f"SELECT {', '.join(f'{e} AS {_q(k)}' for k, e in exprs.items())} "
                           f"FROM db.{_q(name)}")
    out["text_code"], out["texts"] = _text_codes(con, name, out.pop("has_text"))
    out["end_thread"] = _end_threads(con, name, out["thread"], out.pop("crosses"))
    return out


def _end_threads(con, name: str, thread: np.ndarray, crosses: np.ndarray) -> np.ndarray:
    """The thread each row ends on: its own (the same array) but for start/end ranges that
    another thread ended, read in a second query."""
    at = np.flatnonzero(crosses)
    if len(at) == 0:
        return thread
    got = con.execute(f"SELECT endGlobalTid FROM db.{_q(name)} WHERE endGlobalTid != globalTid "
                      "ORDER BY rowid").fetchnumpy()
    values = np.asarray(got[list(got)[0]])
    if len(values) != len(at):
        raise UserError(f"NVTX_EVENTS changed while it was read ({len(at)} ranges ending on "
                        f"another thread, then {len(values)})")
    end_thread = thread.copy()
    end_thread[at] = values
    return end_thread


def _text_codes(con, name: str, with_text: np.ndarray):
    """Per row the index of its text in the returned list ("" first: no text)."""
    codes = np.zeros(len(with_text), np.int64)
    if not with_text.any():
        return codes, [""]
    got = con.execute(
        f"SELECT text FROM db.{_q(name)} WHERE text IS NOT NULL ORDER BY rowid").fetchnumpy()
    values = got[list(got)[0]]
    at = np.flatnonzero(with_text)
    if len(values) != len(at):
        raise UserError(f"NVTX_EVENTS changed while it was read ({len(at)} texts, then "
                        f"{len(values)})")
    texts: dict[str, int] = {"": 0}
    codes[at] = np.fromiter((texts.setdefault(str(t), len(texts)) for t in values), np.int64,
                            len(values))
    return codes, list(texts)


class _Registered:
    """StringIds in id order, and their canonical names (the texts of old-schema rows follow)."""

    def __init__(self, strings: dict[int, str]):
        self.ids = np.array(sorted(strings), dtype=np.int64)
        self.names = [strings[i] for i in self.ids.tolist()]
        self.canonical = tbl.canonical_prefix(self.names)


def _nvtx_table(tables: set[str], path: str) -> str:
    import re

    # nsys-ai reports versioned names (NVTX_EVENTS_V2...) in some exports: accept them too.
    found = sorted(n for n in tables if re.fullmatch(r"NVTX_EVENTS(_V\d+)?", n))
    if not found:
        raise UserError(f"{path}: SQLite file without an NVTX_EVENTS table (no NVTX ranges were "
                        "captured: profile with `nsys profile -t nvtx ...`)")
    return found[0]


def _event_types(con, tables: set[str]) -> dict[int, str]:
    """event type id -> NVIDIA's name, looked up by name where the file has the enum table."""
    types = {v: k for k, v in DEFAULT_TYPES.items()}
    if "ENUM_NSYS_EVENT_TYPE" not in tables:
        return types
    rows = con.execute("SELECT id, name FROM db.ENUM_NSYS_EVENT_TYPE").fetchall()
    by_name = {name: i for i, name in rows if name in DEFAULT_TYPES}
    if by_name:
        types = {i: name for name, i in by_name.items()}
    return types


def _string_ids(con, tables: set[str]) -> dict[int, str]:
    if "StringIds" not in tables:
        return {}
    got = con.execute("SELECT id, value FROM db.StringIds WHERE id IS NOT NULL").fetchnumpy()
    return dict(zip(np.asarray(got["id"]).tolist(),
                    ("" if v is None else str(v) for v in got["value"])))


def _thread_names_table(con, tables: set[str], strings: dict[int, str]) -> dict[int, str]:
    if "ThreadNames" not in tables:
        return {}
    rows = con.execute("SELECT globalTid, nameId FROM db.ThreadNames ORDER BY priority").fetchall()
    return {int(t): strings[n] for t, n in rows if t is not None and n in strings}


def _process_names(con, tables: set[str]) -> dict[int, str]:
    if "PROCESSES" not in tables:
        return {}
    rows = con.execute("SELECT pid, name FROM db.PROCESSES").fetchall()
    return {int(p): n for p, n in rows if p is not None and n}


def _session_clock(con, tables: set[str]) -> str:
    """nsys times count from the session start, which the export gives on the UTC clock."""
    if "TARGET_INFO_SESSION_START_TIME" in tables:
        row = con.execute("SELECT utcEpochNs FROM db.TARGET_INFO_SESSION_START_TIME "
                          "WHERE utcEpochNs IS NOT NULL LIMIT 1").fetchone()
        if row is not None:
            return f"nsys session, started at UTC epoch {int(row[0])} ns"
    return "nsys session (start not recorded)"


def _to_table(raw: dict, registered: "_Registered", thread_names: dict[int, str],
              process_names: dict[int, str], clock: str) -> tbl.RangeTable:
    """Resolve names and domains; metadata rows leave. Consumes `raw` to save memory."""
    names, name_code = _resolve_names(raw.pop("text_id"), raw.pop("text_code"), raw["texts"],
                                      registered)
    kind = raw.pop("kind")
    meta_rows = np.flatnonzero(kind < 0)
    domain_names: dict[tuple[int, int], str] = {}
    if len(meta_rows):
        found = (raw, kind, meta_rows, names, name_code)
        thread_names = {**_thread_name_events(*found), **thread_names}
        domain_names = _domain_names(*found)
        del found
    cols = {"start": raw.pop("start"), "end": raw.pop("end"), "thread": raw.pop("thread"),
            "name": name_code, "end_thread": raw.pop("end_thread"), "domain": raw.pop("domain")}
    del name_code
    if len(meta_rows):  # metadata rows (domains, thread names, categories) leave the table
        rows = np.flatnonzero(kind >= 0)
        shared = cols["end_thread"] is cols["thread"]
        cols = {k: v[rows] for k, v in cols.items() if not (shared and k == "end_thread")}
        if shared:
            cols["end_thread"] = cols["thread"]
        kind = kind[rows]
    domain_id, domains = _domain_ids(cols["thread"], cols.pop("domain"), domain_names)
    return tbl.build(raw_names=names, name_id=cols.pop("name"), start=cols.pop("start"),
                     end=cols.pop("end"), kind=kind, thread=cols.pop("thread"),
                     end_thread=cols.pop("end_thread"), domain_id=domain_id, domains=domains,
                     thread_names=thread_names, process_names=process_names,
                     source="nsys-sqlite", clock=clock, canonical=registered.canonical)


def _resolve_names(text_id: np.ndarray, text_codes: np.ndarray, texts: list[str],
                   registered: _Registered):
    """Name per row: the registered string (textId -> StringIds) if any, else the text."""
    ids = registered.ids
    names = registered.names + list(texts)
    fallback = len(ids) + text_codes
    if len(ids) == 0:
        return names, fallback
    if 0 <= ids[0] and ids[-1] < 4 * len(ids) + (1 << 16):  # nsys numbers its strings densely
        slot = np.full(int(ids[-1]) + 2, -1, np.int64)  # the last slot: ids out of range
        slot[ids] = np.arange(len(ids))
        pos = slot[np.clip(text_id, -1, len(slot) - 1)]
        return names, np.where(pos >= 0, pos, fallback)
    pos = np.minimum(np.searchsorted(ids, text_id), len(ids) - 1)
    return names, np.where(ids[pos] == text_id, pos, fallback)


def _thread_name_events(raw, kind, meta_rows, names, name_code) -> dict[int, str]:
    rows = meta_rows[kind[meta_rows] == THREAD_NAME]
    return {int(raw["thread"][r]): names[int(name_code[r])] for r in rows}


def _domain_names(raw, kind, meta_rows, names, name_code) -> dict[tuple[int, int], str]:
    """(pid bits, domainId) -> name; the first create of a domain in a process wins."""
    rows = meta_rows[kind[meta_rows] == DOMAIN_CREATE]
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
