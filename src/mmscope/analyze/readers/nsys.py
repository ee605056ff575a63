"""Load the SQLite file of `nsys export --type sqlite` (or `mmscope record`) into a RangeTable.

Read through ADBC's SQLite driver (sqlite_source.py): the integer columns of NVTX_EVENTS in rowid
ranges on both cores, the names once per distinct string (textId -> StringIds; the `text` of
unregistered messages only where rows have no textId); both schema eras; per-process domains;
the session's start on the UTC clock; the GPU work of the CUPTI tables (cupti.py). A range that
ends before it starts (or has no start) is skipped and said (profile.malformed).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from mmscope.analyze.ranges import table as tbl
from mmscope.analyze.readers import cupti, malformed, sqlite_source
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
NULL_TIME = np.iinfo(np.int64).min  # a NULL start or end as read
# The integer columns of every row (what the nesting and names need), and the stand-in where a
# file lacks one.
COLUMNS = {"start": ("start", np.int64, NULL_TIME), "end": ('"end"', np.int64, NULL_TIME),
           "thread": ("globalTid", np.int64, 0), "text_id": ("textId", np.int64, -1),
           "type": ("eventType", np.int16, -1), "domain": ("domainId", np.int32, 0)}
PARTS = 2  # rowid ranges read at once: this machine kind's cores


def is_sqlite(head: bytes) -> bool:
    return head.startswith(SQLITE_MAGIC)


def load(path: str, workers: int | None = None) -> tbl.RangeTable:
    """The RangeTable of an nsys SQLite export; bad files raise UserError with one line.
    `workers`: rowid ranges read at once (default: one per core of this machine kind)."""
    import adbc_driver_manager
    import polars as pl

    from mmscope.analyze.readers.arrow_stream import StreamError

    try:
        with sqlite_source.readable(path) as readable:
            table = _read(readable, path, workers or PARTS)
        return table
    except (adbc_driver_manager.Error, pl.exceptions.ComputeError, UnicodeDecodeError,
            StreamError) as e:
        # A corrupt file breaks the SQLite reader, or hands back text that is no UTF-8.
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"{path}: not a readable SQLite database ({why})") from None


def _read(path: str, label: str, parts: int) -> tbl.RangeTable:
    with sqlite_source.connect(path) as con:
        tables = set(sqlite_source.frame(
            con, "SELECT name FROM sqlite_master WHERE type = 'table'")["name"].to_list())
        name = _nvtx_table(tables, label)
        cols = set(sqlite_source.frame(
            con, f"SELECT name FROM pragma_table_info('{name}')")["name"].to_list())
        strings = _string_ids(con, tables)
        thread_names = _thread_names_table(con, tables, strings)
        process_names = _process_names(con, tables)
        clock = _session_clock(con, tables)
        types = _event_types(con, tables)
        ranges = sqlite_source.rowid_ranges(con, _q(name), parts)
    raw = _read_events(path, name, cols, ranges)
    kind, name_code, found = _classified(raw, _kinds(types), strings)
    names = _names(path, name, cols, ranges, name_code, found, strings)
    end_thread = _end_threads(path, name, cols, ranges, raw["thread"], kind, types)
    table = _to_table(raw, kind, names, name_code, found, end_thread, thread_names,
                      process_names, clock, label)
    with sqlite_source.connect(path) as con:
        table.device, table.no_device = cupti.read(con, path, tables, strings, parts, table)
    return table


def _q(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _read_events(path: str, name: str, cols: set[str], ranges) -> dict[str, np.ndarray]:
    """The integer columns of every NVTX row, in rowid order, NULLs as COLUMNS says."""
    select = ", ".join(f"{sql if column in cols else 'NULL'} AS {key}"
                       for key, (sql, _, _) in COLUMNS.items()
                       for column in [sql.strip('"')])
    got = sqlite_source.int_columns(
        path, [(f"SELECT {select} FROM {_q(name)} WHERE rowid > {{lo}} AND rowid <= {{hi}}",
                ranges)],
        [dtype for _, dtype, _ in COLUMNS.values()], [null for _, _, null in COLUMNS.values()])
    return dict(zip(COLUMNS, got))


def _kinds(types: dict[int, str]) -> np.ndarray:
    """Kind per event type id, the last entry for ids out of range (and NULL: -1)."""
    top = max(types, default=0) + 2
    kinds = np.full(top, OTHER, np.int8)
    for i, n in types.items():
        k = KIND_OF_TYPE.get(n, META_KINDS.get(n))
        if k is not None and i >= 0:
            kinds[i] = k
    return kinds


@njit(cache=True, nogil=True)
def _classify(event_type, text_id, start, end, kinds, slot, ids, kind, pos, found):
    """Per row its kind (kinds[event type], the last entry for types out of range) and the
    position of its registered name (slot[textId] where the ids are dense, else a search of
    `ids`; -1: none); found = (metadata rows, malformed ranges, the first malformed row, rows
    without a registered name, of those the ones with a textId)."""
    last, dense, top = len(kinds) - 1, len(slot) > 0, len(ids) - 1
    meta, bad, first_bad, unnamed, with_id = 0, 0, -1, 0, 0
    for i in range(len(event_type)):
        t = event_type[i]
        k = kinds[t] if 0 <= t <= last else kinds[last]
        kind[i] = k
        if k < 0:
            meta += 1
        elif start[i] == NULL_TIME or (end[i] != NULL_TIME and end[i] < start[i]):
            if bad == 0:
                first_bad = i
            bad += 1
        tid = text_id[i]
        p = -1
        if dense:
            if 0 <= tid < len(slot):
                p = slot[tid]
        elif top >= 0:
            at = min(np.searchsorted(ids, tid), top)
            if ids[at] == tid:
                p = at
        pos[i] = p
        if p < 0:
            unnamed += 1
            if tid >= 0:
                with_id += 1
    found[0], found[1], found[2], found[3], found[4] = meta, bad, first_bad, unnamed, with_id


class Found:
    """What the classifying pass counted: metadata rows, malformed ranges (and the first), rows
    without a registered name (and how many of those have a textId)."""

    def __init__(self, counts: np.ndarray):
        self.meta, self.bad, self.first_bad, self.unnamed, self.with_id = counts.tolist()


def _classified(raw: dict, kinds: np.ndarray, registered: Strings):
    """Each row's kind and registered name's position (-1: none), in one pass; consumes the
    event type and textId columns."""
    ids = registered.ids
    slot = np.zeros(0, np.int32)
    if len(ids) and 0 <= ids[0] and ids[-1] < 4 * len(ids) + (1 << 16):  # nsys numbers densely
        slot = np.full(int(ids[-1]) + 1, -1, np.int32)
        slot[ids] = np.arange(len(ids))
    n = len(raw["start"])
    kind, pos, found = np.empty(n, np.int8), np.empty(n, np.int32), np.zeros(5, np.int64)
    _classify(raw.pop("type"), raw.pop("text_id"), raw["start"], raw["end"], kinds, slot, ids,
              kind, pos, found)
    return kind, pos, Found(found)


def _names(path: str, name: str, cols: set[str], ranges, pos: np.ndarray, found: Found,
           registered: Strings) -> list[str]:
    """The names `pos` indexes: the registered strings, then the texts of the rows without one,
    read only for those rows, coded once per distinct text (`pos` filled in for them)."""
    texts = [""]
    if found.unnamed:
        unnamed = np.flatnonzero(pos < 0)
        n_ids = len(registered.ids)
        if "text" in cols:
            where = ("" if "textId" not in cols else "textId IS NULL AND "
                     if found.with_id == 0 else
                     "(textId IS NULL OR textId NOT IN (SELECT id FROM StringIds)) AND ")
            codes, texts = _text_codes(path, name, ranges, len(unnamed), where)
            pos[unnamed] = n_ids + codes
        else:
            pos[unnamed] = n_ids  # no text: the name ""
    return registered.names + texts


def _text_codes(path: str, name: str, ranges, expected: int, where: str):
    """The texts of the rows without a registered name (`where`), in rowid order, coded by
    first appearance."""
    import polars as pl

    parts = sqlite_source.partitioned(
        path, f"SELECT coalesce(text, '') AS text FROM {_q(name)} WHERE {where}"
              "rowid > {lo} AND rowid <= {hi}", ranges)
    # A range without rows reads as a column of SQLite's default type: left out.
    text = pl.concat([p["text"].cast(pl.Binary) for p in parts if p.height]
                     or [pl.Series("text", [], pl.Binary)])
    if len(text) != expected:
        raise UserError(f"NVTX_EVENTS changed while it was read ({expected} rows without a "
                        f"textId, then {len(text)})")
    distinct = text.unique(maintain_order=True)
    codes = text.replace_strict(distinct, pl.int_range(len(distinct), eager=True),
                                return_dtype=pl.Int64).to_numpy()
    return codes, [b.decode("utf-8") for b in distinct.to_list()]


def _end_threads(path: str, name: str, cols: set[str], ranges, thread: np.ndarray,
                 kind: np.ndarray, types: dict[int, str]) -> np.ndarray:
    """The thread each row ends on, read for the start/end rows only; None where each ends on
    its own."""
    start_end = np.flatnonzero(kind == tbl.START_END)
    if len(start_end) == 0 or "endGlobalTid" not in cols:
        return None
    ids = ", ".join(str(i) for i, n in types.items() if KIND_OF_TYPE.get(n) == tbl.START_END)
    (values,) = sqlite_source.int_columns(
        path, [(f"SELECT coalesce(endGlobalTid, globalTid, 0) AS t FROM {_q(name)} "
                f"WHERE eventType IN ({ids}) AND rowid > {{lo}} AND rowid <= {{hi}}", ranges)],
        [np.int64], [0])
    if len(values) != len(start_end):
        raise UserError(f"NVTX_EVENTS changed while it was read ({len(start_end)} start/end "
                        f"ranges, then {len(values)})")
    if (values == thread[start_end]).all():
        return None
    end_thread = thread.copy()
    end_thread[start_end] = values
    return end_thread


class Strings:
    """StringIds in id order: `ids` ascending and their `names` (the texts of old-schema rows
    follow them in the table's name list)."""

    def __init__(self, ids: np.ndarray, names: list[str]):
        self.ids, self.names = ids, names

    def get(self, string_id: int, default: str | None = None) -> str | None:
        at = int(np.searchsorted(self.ids, string_id))
        return self.names[at] if at < len(self.ids) and self.ids[at] == string_id else default


def _nvtx_table(tables: set[str], path: str) -> str:
    import re

    # nsys-ai reports versioned names (NVTX_EVENTS_V2...) in some exports: accept them too.
    found = sorted(n for n in tables if re.fullmatch(r"NVTX_EVENTS(_V\d+)?", n))
    if not found:
        raise UserError(f"{path}: SQLite file without an NVTX_EVENTS table (no NVTX ranges were "
                        "captured: profile with `nsys profile -t nvtx ...`)")
    return found[0]


def _rows(con, query: str) -> list[tuple]:
    return sqlite_source.frame(con, query).rows()


def _event_types(con, tables: set[str]) -> dict[int, str]:
    """event type id -> NVIDIA's name, looked up by name where the file has the enum table."""
    types = {v: k for k, v in DEFAULT_TYPES.items()}
    if "ENUM_NSYS_EVENT_TYPE" not in tables:
        return types
    rows = _rows(con, "SELECT id, name FROM ENUM_NSYS_EVENT_TYPE")
    by_name = {name: i for i, name in rows if name in DEFAULT_TYPES and i is not None}
    if by_name:
        types = {i: name for name, i in by_name.items()}
    return types


def _string_ids(con, tables: set[str]) -> Strings:
    """StringIds (of an id given twice, the later row's); a text that is no UTF-8 raises
    polars' ComputeError."""
    import polars as pl

    if "StringIds" not in tables:
        return Strings(np.zeros(0, np.int64), [])
    got = sqlite_source.frame(con, "SELECT id, coalesce(value, '') AS value FROM StringIds "
                                   "WHERE id IS NOT NULL")
    got = got.unique("id", keep="last", maintain_order=True).sort("id")
    # Validated as UTF-8 in one call, then handed over as str objects.
    names = got["value"].cast(pl.Binary).cast(pl.String, strict=True).to_list()
    return Strings(got["id"].cast(pl.Int64).to_numpy(), names)


def _thread_names_table(con, tables: set[str], strings: Strings) -> dict[int, str]:
    if "ThreadNames" not in tables:
        return {}
    rows = _rows(con, "SELECT globalTid, nameId FROM ThreadNames ORDER BY priority")
    found = ((t, strings.get(n)) for t, n in rows if t is not None and n is not None)
    return {int(t): name for t, name in found if name is not None}


def _process_names(con, tables: set[str]) -> dict[int, str]:
    if "PROCESSES" not in tables:
        return {}
    rows = _rows(con, "SELECT pid, name FROM PROCESSES")
    return {int(p): n for p, n in rows if p is not None and n}


def _session_clock(con, tables: set[str]) -> str:
    """nsys times count from the session start, which the export gives on the UTC clock."""
    if "TARGET_INFO_SESSION_START_TIME" in tables:
        rows = _rows(con, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME "
                          "WHERE utcEpochNs IS NOT NULL LIMIT 1")
        if rows:
            return f"nsys session, started at UTC epoch {int(rows[0][0])} ns"
    return "nsys session (start not recorded)"


def _to_table(raw: dict, kind: np.ndarray, names: list[str], name_code: np.ndarray,
              found: Found, end_thread: np.ndarray | None, thread_names: dict[int, str],
              process_names: dict[int, str], clock: str, label: str) -> tbl.RangeTable:
    """Metadata rows and malformed ranges leave; domains resolved. Consumes `raw`."""
    domain_names: dict[tuple[int, int], str] = {}
    if found.meta:
        meta_rows = np.flatnonzero(kind < 0)
        at = (raw, kind, meta_rows, names, name_code)
        thread_names = {**_thread_name_events(*at), **thread_names}
        domain_names = _domain_names(*at)
        del at
    start, end = raw["start"], raw["end"]
    said = malformed.nsys_said(found.bad, found.first_bad, start, end, raw["thread"], names,
                               name_code, len(kind) - found.meta)
    cols = {"start": start, "end": end, "thread": raw.pop("thread"), "name": name_code,
            "end_thread": end_thread, "domain": raw.pop("domain"), "kind": kind}
    del start, end, raw, name_code
    if found.meta or found.bad:  # metadata rows (domains, thread names, categories) leave
        keep = cols["kind"] >= 0
        if found.bad:
            keep &= ~_malformed(cols["kind"], cols["start"], cols["end"])
        rows = np.flatnonzero(keep)
        cols = {k: None if v is None else v[rows] for k, v in cols.items()}
    domain_id, domains = _domain_ids(cols["thread"], cols.pop("domain"), domain_names)
    table = tbl.build(raw_names=names, name_id=cols.pop("name"), start=cols.pop("start"),
                      end=cols.pop("end"), kind=cols.pop("kind"), thread=cols.pop("thread"),
                      end_thread=cols.pop("end_thread"), domain_id=domain_id, domains=domains,
                      thread_names=thread_names, process_names=process_names,
                      source="nsys-sqlite", clock=clock)
    table.malformed = said
    return table


def _malformed(kind: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The ranges with no start or an end before their start (as _classify counts them)."""
    return (kind >= 0) & ((start == NULL_TIME) | ((end != NULL_TIME) & (end < start)))


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
    """Domain name index per row: "" for domain 0, the created name, or "domain N" if unnamed;
    None where every row is in domain 0."""
    if not domain.any():
        return None, [""]
    domain_id = np.zeros(len(thread), np.int32)
    index = {"": 0}
    pid = thread & PID_BITS
    for d in np.unique(domain[domain != 0]).tolist():
        in_d = domain == d
        for p in np.unique(pid[in_d]).tolist():
            name = names.get((p, d), f"domain {d}")
            domain_id[in_d & (pid == p)] = index.setdefault(name, len(index))
    return domain_id, list(index)
