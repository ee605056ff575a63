"""Read the NVTX_EVENTS rows of an nsys SQLite file from its b-tree pages, vectorised with numpy.

SQLite hands Python one value at a time (about 0.2 µs a row plus 0.1 µs a column); here the table's
leaf pages are read in large runs and every record of a batch is decoded at once: cell pointers,
varints, serial types and big-endian integers become a few numpy gathers per column. Anything this
reader does not handle exactly as SQLite would (a WAL or hot journal, overflow pages, a non-UTF-8
text encoding, generated columns, a float or text where an integer belongs, a missing column with
a default, undecodable text) raises `Unsupported`, and the caller reads the file through SQLite.
The output is `nsys_scan.read_range`'s: the same columns, in rowid order.
"""
from __future__ import annotations

import mmap
import os
import sqlite3
from dataclasses import dataclass

import numpy as np

from mmscope.analyze import kernels

MAGIC = b"SQLite format 3\x00"
LEAF, INTERIOR = 0x0D, 0x05
BATCH_BYTES = 1 << 20  # leaf pages decoded together: bounds the reader's own memory
SEP = 0x1F  # joins a batch's texts into one string; a batch whose texts hold it goes row by row
HIGH_BITS = np.uint64(0x8080808080808080)
# Bytes of the value of serial types 0-9 (NULL, 8-, 16-, 24-, 32-, 48-, 64-bit int, float, 0, 1).
FIXED_SIZE = np.array([0, 1, 2, 3, 4, 6, 8, 8, 0, 0, 0, 0], np.int64)
SIZE_OF = np.concatenate([FIXED_SIZE, (np.arange(12, 256) - 12) >> 1])  # one-byte serial types
SHIFT = 64 - 8 * np.maximum(FIXED_SIZE, 1)  # an n-byte integer is the top n of 8 bytes read
WANTED = ("start", "end", "eventType", "text", "globalTid", "endGlobalTid", "textId", "domainId")


class Unsupported(Exception):
    """The file holds something this reader does not decode; SQLite reads it instead."""


@dataclass(frozen=True)
class Layout:
    """Where the table lives and which record field each wanted column is (None: not in it)."""

    root: int
    fields: dict[str, int | None]


def layout(con: sqlite3.Connection, table: str) -> Layout | None:
    """The table's root page and field positions, or None where records are not plain rows."""
    row = con.execute("SELECT rootpage, sql FROM sqlite_master WHERE type = 'table' AND name = ?",
                      (table,)).fetchone()
    if row is None or not row[0] or "without rowid" in (row[1] or "").lower():
        return None
    try:
        info = con.execute(f"PRAGMA table_xinfo({table})").fetchall()
    except sqlite3.DatabaseError:
        return None
    fields: dict[str, int | None] = dict.fromkeys(WANTED)
    for cid, name, _type, _notnull, default, pk, hidden in info:
        if hidden:  # generated or hidden columns are not stored where their position says
            return None
        if name in fields:
            if pk or default is not None:  # a rowid alias, or a default older rows would take
                return None
            fields[name] = cid
    if fields["start"] is None or fields["eventType"] is None:
        return None
    return Layout(int(row[0]), fields)


def read(path: str, lay: Layout) -> dict:
    """Columns, other-thread ends and dictionary-coded texts of every row, in rowid order."""
    try:
        with open(path, "rb", buffering=0) as f:
            return _read(f, path, lay)
    except (OSError, IndexError, ValueError, OverflowError) as e:  # a page not as expected
        raise Unsupported(f"{type(e).__name__}: {e}") from None


def _read(f, path: str, lay: Layout) -> dict:
    page_size, usable = _check_header(path, _pread(f, 100, 0))
    n_pages = os.fstat(f.fileno()).st_size // page_size
    leaves = _leaf_pages(f, lay.root, page_size, n_pages)
    if kernels.lib() is not None:
        got = _read_c(f, leaves, page_size, usable, lay)
        if got is not None:
            return got
        # The C decoder refuses a few records numpy takes (e.g. a varint that runs past its
        # header): numpy decides, and raises Unsupported where SQLite must.
    per_batch = max(1, BATCH_BYTES // page_size)
    buf = np.empty(per_batch * page_size + 8, np.uint8)  # +8: 8-byte reads near the end
    out, texts, n = Columns(), {"": 0}, 0
    for i in range(0, len(leaves), per_batch):
        pages = leaves[i:i + per_batch]
        _read_pages(f, pages, page_size, buf)
        n += _decode(buf, len(pages), page_size, usable, lay, texts, out, n,
                     len(leaves) - i)
    return out.result(n, texts)


def _read_c(f, leaves: np.ndarray, page_size: int, usable: int, lay: Layout) -> dict | None:
    """The C decoder's output over the mapped file, or None where it does not take the file."""
    fields = [-1 if lay.fields[k] is None else lay.fields[k] for k in WANTED]
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # faulted in one go, not by page
    with mmap.mmap(f.fileno(), 0, flags=flags, prot=mmap.PROT_READ) as mm:
        buf = np.frombuffer(mm, np.uint8)
        try:
            got = kernels.decode_leaves(buf, leaves, page_size, usable, fields)
        finally:
            del buf  # the map cannot close while an array views it
        if got is None:
            return None
        out, toff, tlen = got
        try:
            texts = [""] + [mm[o:o + k].decode("utf-8") for o, k in zip(toff.tolist(),
                                                                       tlen.tolist())]
        except UnicodeDecodeError as e:
            raise Unsupported(f"text: not UTF-8 ({e})") from None
    out["texts"] = texts
    return out


def _pread(f, size: int, offset: int) -> bytes:
    f.seek(offset)
    return f.read(size)


def _check_header(path: str, head: bytes) -> tuple[int, int]:
    if len(head) < 100 or not head.startswith(MAGIC):
        raise Unsupported("not an SQLite 3 file")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        raise Unsupported(f"page size {page_size}")
    if head[18] == 2 or head[19] == 2:  # WAL: committed pages may still sit in the -wal file
        wal = path + "-wal"
        if os.path.exists(wal) and os.path.getsize(wal) > 0:
            raise Unsupported("write-ahead log present")
    journal = path + "-journal"
    if os.path.exists(journal) and os.path.getsize(journal) > 0:
        raise Unsupported("rollback journal present")
    if int.from_bytes(head[56:60], "big") not in (0, 1):
        raise Unsupported("text encoding is not UTF-8")
    return page_size, page_size - head[20]


def _leaf_pages(f, root: int, page_size: int, n_pages: int) -> np.ndarray:
    """The table's leaf pages in key order: one level of interior pages at a time."""
    level = np.array([root], np.int64)
    for _ in range(64):
        if level.min() < 2 or level.max() > n_pages:
            raise Unsupported("page number out of range")
        children, leaf = [], None
        for pgno in level.tolist():
            page = _pread(f, page_size, (pgno - 1) * page_size)
            if len(page) != page_size:
                raise Unsupported("file shorter than its b-tree")
            kind = page[0]
            if leaf is None:
                leaf = kind == LEAF
            if kind != (LEAF if leaf else INTERIOR):
                raise Unsupported(f"page {pgno} is of type {kind}")
            if leaf:
                break
            children.append(_interior_children(page))
        if leaf:
            return level
        level = np.concatenate(children)
    raise Unsupported("b-tree too deep")


def _interior_children(page: bytes) -> np.ndarray:
    n = int.from_bytes(page[3:5], "big")
    b = np.frombuffer(page, np.uint8)
    ptr = np.frombuffer(page, ">u2", n, 12).astype(np.int64)
    child = (b[ptr].astype(np.int64) << 24 | b[ptr + 1].astype(np.int64) << 16
             | b[ptr + 2].astype(np.int64) << 8 | b[ptr + 3])
    return np.append(child, int.from_bytes(page[8:12], "big"))


def _read_pages(f, pages: np.ndarray, page_size: int, buf: np.ndarray) -> None:
    """Pages into consecutive slots of buf, one read per run of consecutive page numbers."""
    view = memoryview(buf)
    breaks = np.flatnonzero(np.diff(pages) != 1) + 1
    for a, b in zip(np.r_[0, breaks].tolist(), np.r_[breaks, len(pages)].tolist()):
        f.seek(int(pages[a] - 1) * page_size)
        at, stop = a * page_size, b * page_size
        while at < stop:
            got = f.readinto(view[at:stop])
            if not got:
                raise Unsupported("file shorter than its b-tree")
            at += got


def _be64(buf: np.ndarray) -> np.ndarray:
    """buf as overlapping big-endian int64s: [i] is the 8 bytes from offset i."""
    return np.ndarray(shape=(len(buf) - 7,), dtype=">i8", buffer=buf, offset=0, strides=(1,))


def _varint_len(be: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Bytes of the varints at pos: up to and including the first byte below 0x80 (9 at most)."""
    clear = ~be[pos].astype(np.int64).view(np.uint64) & HIGH_BITS
    n = np.full(len(pos), 9, np.int64)
    some = clear != 0
    # The highest clear-marker bit is exact in float64: the markers are 8 bits apart.
    top = np.floor(np.log2(clear[some].astype(np.float64))).astype(np.int64)
    n[some] = (63 - top) // 8 + 1
    return n


def _varint(b: np.ndarray, be: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values and byte lengths of the varints at pos (one-byte ones take the fast road)."""
    val = b[pos].astype(np.int64)
    n = np.ones(len(pos), np.int64)
    long = np.flatnonzero(val >= 0x80)
    if len(long):
        p = pos[long]
        ln = _varint_len(be, p)
        v = np.zeros(len(long), np.int64)
        for k in range(9):
            byte = b[p + k].astype(np.int64)
            last = k == 8
            step = np.where(last, (v << 8) | byte, (v << 7) | (byte & 0x7F))
            v = np.where(k < ln, step, v)
        val[long], n[long] = v, ln
    return val, n


def _decode(buf: np.ndarray, n_pages: int, page_size: int, usable: int, lay: Layout,
            texts: dict[str, int], out: "Columns", at: int, pages_left: int) -> int:
    """Decode a batch of leaf pages into out's columns from row `at`; the number of rows."""
    b = buf[:n_pages * page_size + 8]
    be = _be64(b)
    base = np.arange(n_pages, dtype=np.int64) * page_size
    if (b[base] != LEAF).any():
        raise Unsupported("a leaf level page is not a table leaf")
    ncell = (b[base + 3].astype(np.int64) << 8) | b[base + 4]
    n = int(ncell.sum())
    page_of = np.repeat(base, ncell)
    first = np.repeat(np.cumsum(ncell) - ncell, ncell)
    slot = page_of + 8 + 2 * (np.arange(n, dtype=np.int64) - first)
    cell = page_of + ((b[slot].astype(np.int64) << 8) | b[slot + 1])
    del slot, first
    payload, n1 = _varint(b, be, cell)
    if payload.size and payload.max() > usable - 35:  # spills into overflow pages
        raise Unsupported("overflow pages")
    rec = cell + n1 + _rowid_len(be, cell + n1)  # past the rowid
    end_rec = rec + payload
    if end_rec.size and ((cell < page_of + 8) | (end_rec > page_of + usable)).any():
        raise Unsupported("cell outside its page")
    del cell, page_of, payload, n1
    hsize, n3 = _varint(b, be, rec)
    want = {lay.fields[k]: k for k in WANTED if lay.fields[k] is not None}
    # Room for the rest at this batch's rows per page (grown if that falls short).
    dest = out.reserve(at, n, at + n * pages_left // n_pages)
    into = {k: dest[v] for k, v in SQL_NAME.items()}
    val, null, text = _columns(b, be, rec, hsize, n3, end_rec, want, into)
    # The SQL readers' coalesce()s, in place.
    if null["start"].any() or null["eventType"].any():
        raise Unsupported("NULL start or eventType")
    start = dest["start"]
    for name, column, default in (("end", "end", None), ("globalTid", "thread", 0),
                                  ("textId", "text_id", -1), ("domainId", "domain", 0)):
        if name not in val:
            dest[column][:] = start - 1 if default is None else default
        elif null[name].any():
            nulls = null[name]
            dest[column][nulls] = start[nulls] - 1 if default is None else default
    dest["event_type"][:] = val["eventType"]  # int16, as the SQL readers' astype
    egt = val.get("endGlobalTid")
    if egt is not None and "globalTid" in val:
        cross = np.flatnonzero(~null["endGlobalTid"] & ~null["globalTid"]
                               & (egt != dest["thread"]))
        out.add_cross(cross + at, egt[cross])
    if text is not None:
        _text_codes(b, *text, texts, dest["text_code"])
    else:
        dest["text_code"][:] = 0
    return n


def _rowid_len(be: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Bytes of the rowid varints at pos. Rowids ascend along the leaves and a varint's length
    grows with its value, so where the batch's first and last take the same bytes all do."""
    if len(pos) > 2:
        ends = _varint_len(be, pos[[0, -1]])
        if ends[0] == ends[1] < 9:  # both non-negative: every rowid between has that length
            return np.full(len(pos), ends[0], np.int64)
    return _varint_len(be, pos)


MAX_PATTERNS = 8  # header patterns decoded as such per batch; rows past them take the long road


def _columns(b, be, rec, hsize, n3, end_rec, want: dict[int, str], into: dict[str, np.ndarray]):
    """Per wanted integer column its values (written into `into` where it has the column) and
    NULLs; for the text column serial types and offsets.

    Rows of a batch share a handful of headers (the serial types of the fields, e.g. a start
    time in 4 or 6 bytes, a NULL end), so rows are taken a header pattern at a time: within one
    every field's type and offset is a constant and each column is a single gather. Rows whose
    header is not one byte per field, and rows of rarer patterns, go field by field."""
    m, nf = len(rec), max(want) + 1
    val = {name: into[name] if name in into else np.empty(m, np.int64)
           for name in want.values() if name != "text"}
    null = {name: np.empty(m, bool) for name in val}
    text = (np.empty(m, np.int64), np.empty(m, np.int64)) if "text" in want.values() else None
    left = np.arange(m)
    if nf <= 16 and m:
        h0 = be[rec + 1].astype(np.int64).view(np.uint64)
        h1 = be[rec + 9].astype(np.int64).view(np.uint64) if nf > 8 else np.zeros(m, np.uint64)
        k0, k1 = min(nf, 8), max(nf - 8, 0)
        high0 = np.uint64(int.from_bytes(b"\x80" * k0 + b"\x00" * (8 - k0), "big"))
        high1 = np.uint64(int.from_bytes(b"\x80" * k1 + b"\x00" * (8 - k1), "big"))
        fast = (n3 == 1) & (hsize > nf) & (((h0 & high0) | (h1 & high1)) == 0)
        # Only the first nf serial types matter: the bytes past them must not split patterns.
        h0 &= np.uint64(int.from_bytes(b"\xff" * k0 + b"\x00" * (8 - k0), "big"))
        h1 &= np.uint64(int.from_bytes(b"\xff" * k1 + b"\x00" * (8 - k1), "big"))
        todo, left = np.flatnonzero(fast), np.flatnonzero(~fast)
        for _ in range(MAX_PATTERNS):
            if len(todo) == 0:
                break
            r = todo[0]
            same = (h0[todo] == h0[r]) & (h1[todo] == h1[r]) & (hsize[todo] == hsize[r])
            if same.all():
                rows, todo = todo, todo[:0]
            else:
                rows, todo = todo[same], todo[~same]
            types = [(int(h0[r]) >> (56 - 8 * j)) & 0xFF for j in range(k0)]
            types += [(int(h1[r]) >> (56 - 8 * j)) & 0xFF for j in range(k1)]
            _pattern(b, be, rec, end_rec, rows, types, int(hsize[r]), want, val, null, text)
        left = np.concatenate([left, todo])
    if len(left):
        st, off = _fields(b, be, rec[left], hsize[left], n3[left], nf, end_rec[left])
        for field, name in want.items():
            if name == "text":
                text[0][left], text[1][left] = st[field], off[field]
            else:
                val[name][left], null[name][left] = _integers(b, be, st[field], off[field], name)
    return val, null, text


def _pattern(b, be, rec, end_rec, rows, types: list[int], hsize: int, want, val, null, text):
    """Decode rows that share one header: serial types `types`, header size `hsize`."""
    offsets, at = [], hsize
    for t in types:
        offsets.append(at)
        at += int(SIZE_OF[t])
    r = rec[rows]
    if (r + at > end_rec[rows]).any():
        raise Unsupported("record fields past the payload")
    for field, name in want.items():
        t, where = types[field], r + offsets[field]
        if name == "text":
            text[0][rows], text[1][rows] = t, where
            continue
        if t == 7 or t >= 10:
            raise Unsupported(f"{name}: a float, text or blob where an integer belongs")
        null[name][rows] = t == 0
        size = int(FIXED_SIZE[t])
        if size == 0:
            val[name][rows] = 1 if t == 9 else 0
        elif size == 1:
            val[name][rows] = b[where].view(np.int8)
        else:
            val[name][rows] = be[where].astype(np.int64) >> (64 - 8 * size)


def _fields(b, be, rec, hsize, n3, nf: int, end_rec):
    """Serial types and body offsets of the first nf fields of each record (absent ones: NULL).

    Records whose header is one byte per field (every field but long texts and blobs) read
    their serial types from two 8-byte loads; the others step through the varints."""
    m = len(rec)
    st = np.zeros((nf, m), np.int64)
    off = np.zeros((nf, m), np.int64)
    fast = (n3 == 1) & (hsize > nf)
    if nf <= 16:
        h0 = be[rec + 1].astype(np.int64).view(np.uint64)
        h1 = be[rec + 9].astype(np.int64).view(np.uint64) if nf > 8 else np.zeros(m, np.uint64)
        k0, k1 = min(nf, 8), max(nf - 8, 0)
        mask0 = np.uint64(int.from_bytes(b"\x80" * k0 + b"\x00" * (8 - k0), "big"))
        mask1 = np.uint64(int.from_bytes(b"\x80" * k1 + b"\x00" * (8 - k1), "big"))
        fast &= ((h0 & mask0) | (h1 & mask1)) == 0
        body = rec + hsize
        for j in range(nf):
            h = h0 if j < 8 else h1
            st[j] = (h >> np.uint64(56 - 8 * (j % 8))) & np.uint64(0xFF)
            off[j] = body
            body = body + SIZE_OF[st[j]]
    else:
        fast[:] = False
        body = None
    slow = np.flatnonzero(~fast)
    if len(slow):
        hpos, hend = rec[slow] + n3[slow], rec[slow] + hsize[slow]
        pos = hend.copy()
        for j in range(nf):
            present = hpos < hend
            t, n = _varint(b, be, np.where(present, hpos, hend))
            t = np.where(present, t, 0)
            hpos = hpos + np.where(present, n, 0)
            st[j, slow], off[j, slow] = t, pos
            pos = pos + np.where(t < 12, FIXED_SIZE[np.minimum(t, 11)], (t - 12) >> 1)
        if (hpos > hend).any() or (pos > end_rec[slow]).any():
            raise Unsupported("record fields past the payload")
    if body is not None and (body[fast] > end_rec[fast]).any():
        raise Unsupported("record fields past the payload")
    return st, off


def _integers(b: np.ndarray, be: np.ndarray, st: np.ndarray, off: np.ndarray, name: str):
    """Integer values (serial types 0-6, 8, 9) and where they are NULL."""
    lo, hi = (int(st.min()), int(st.max())) if len(st) else (0, 0)
    if hi >= 10 or (lo <= 7 <= hi and (st == 7).any()):
        raise Unsupported(f"{name}: a float, text or blob where an integer belongs")
    if lo == hi and FIXED_SIZE[lo] == 0:  # all NULL, 0 or 1: nothing to read
        return np.full(len(st), int(lo == 9), np.int64), np.full(len(st), lo == 0)
    if hi <= 1 or not ((st > 1) & (st < 8)).any():
        val = b[off].view(np.int8).astype(np.int64)  # one byte (or none) each
    else:
        val = be[off].astype(np.int64)
        val >>= SHIFT[st]  # arithmetic: the sign extends
    if lo == 0 or hi >= 8:
        const = (st == 0) | (st >= 8)
        val[const] = st[const] == 9
    return val, st == 0


def _text_codes(b: np.ndarray, st: np.ndarray, off: np.ndarray, texts: dict[str, int],
                codes: np.ndarray) -> None:
    """Dictionary codes of the text column into `codes` (NULL and '' are code 0), first
    appearance first."""
    codes[:] = 0
    if ((st >= 1) & (st < 13)).any() or ((st >= 13) & (st % 2 == 0)).any():
        raise Unsupported("text: a number or blob in the text column")
    rows = np.flatnonzero(st > 13)
    if len(rows) == 0:
        return
    length = (st[rows] - 13) >> 1
    at = off[rows]
    # Gather every text (and a separator after each) into one string; SQLite decodes strictly.
    ends = np.cumsum(length + 1)
    idx = np.repeat(at - (ends - length - 1), length + 1) + np.arange(int(ends[-1]))
    data = b[np.minimum(idx, len(b) - 1)]
    data[ends - 1] = SEP
    try:
        if np.count_nonzero(data == SEP) == len(rows):
            parts = data[:-1].tobytes().decode("utf-8").split(chr(SEP))
        else:
            parts = [b[a:a + k].tobytes().decode("utf-8")
                     for a, k in zip(at.tolist(), length.tolist())]
    except UnicodeDecodeError as e:
        raise Unsupported(f"text: not UTF-8 ({e})") from None
    codes[rows] = np.fromiter((texts.setdefault(t, len(texts)) for t in parts), np.int32,
                              len(parts))


ARRAYS = (("start", np.int64), ("end", np.int64), ("thread", np.int64), ("text_id", np.int64),
          ("event_type", np.int16), ("domain", np.int64), ("text_code", np.int32))
# The int64 output columns that hold a table column's raw values before the coalesce()s.
SQL_NAME = {"start": "start", "end": "end", "globalTid": "thread", "textId": "text_id",
            "domainId": "domain"}


class Columns:
    """The output columns, decoded batch by batch straight into arrays sized from the first
    batch (and grown where later ones hold more rows per page)."""

    def __init__(self):
        self.arrays = {name: np.zeros(0, dt) for name, dt in ARRAYS}
        self.cross_pos: list[np.ndarray] = []
        self.cross_thread: list[np.ndarray] = []

    def reserve(self, at: int, m: int, expect: int) -> dict[str, np.ndarray]:
        """Views of rows [at, at + m) of every column."""
        if at + m > len(self.arrays["start"]):
            size = max(expect + expect // 16, at + m)
            for name, dt in ARRAYS:
                grown = np.empty(size, dt)
                grown[:at] = self.arrays[name][:at]
                self.arrays[name] = grown
        return {name: a[at:at + m] for name, a in self.arrays.items()}

    def add_cross(self, pos: np.ndarray, thread: np.ndarray) -> None:
        if len(pos):
            self.cross_pos.append(pos)
            self.cross_thread.append(thread)

    def result(self, n: int, texts: dict[str, int]) -> dict:
        out = {name: a[:n] for name, a in self.arrays.items()}
        out["cross_pos"] = np.concatenate([np.zeros(0, np.int64)] + self.cross_pos)
        out["cross_thread"] = np.concatenate([np.zeros(0, np.int64)] + self.cross_thread)
        out["texts"] = list(texts)
        return out
