"""The range table every loader produces and every computation reads, and the nesting that fills it.

One row per NVTX range or mark (or Chrome event); names are ids into a small canonical-name list.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from mmscope import stages
from mmscope.analyze.ranges.beside import Beside
from mmscope.analyze.ranges.nesting import (NO_PARENT, by_group, code_type, dense_codes,
                                             depths, nest, offsets, position_type, seek,
                                             sort_segments, walk_of)

PUSH_POP, START_END, MARK = 0, 1, 2
KIND_NAMES = ("push_pop", "start_end", "mark")


@dataclass
class RangeTable:
    """Columns (numpy, one entry per range, in file order) plus the small lookup lists.

    `name_id` indexes `names` (canonical spellings, see `stages.canonical`); `domain_id` indexes
    `domains` ("" is the default domain); `threads` holds the distinct threads ascending (nsys'
    globalTid, pid << 24 | tid) and `group` each row's nesting group, its thread's index into
    `threads` * `n_subs` + its (domain, kind) index (a row's thread is `thread_of`); `parent`
    is the row index of the enclosing range or -1; `unclosed` rows had no end (their end is the
    profile's last timestamp, as nsys' own reports do); `crossing` holds the rows that overlap
    an earlier range of their thread partly (neither contains the other: not nested, one level);
    `slack_ns` is how far a child may end after its parent and still nest (the format's time
    resolution); `device` the GPU work the ranges launched (None: the profile has no device side,
    `no_device` says why); `ends_elsewhere` the rows that end on another thread and those
    threads; `order` the rows in nesting order (None: row order is it). Every row is a stage: a
    range a program named.
    """

    name_id: np.ndarray
    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray
    domain_id: np.ndarray
    unclosed: np.ndarray
    parent: np.ndarray
    names: list[str]
    group: np.ndarray
    threads: np.ndarray
    n_subs: int = 1
    domains: list[str] = field(default_factory=lambda: [""])
    thread_names: dict[int, str] = field(default_factory=dict)
    process_names: dict[int, str] = field(default_factory=dict)
    source: str = ""
    clock: str = ""
    crossing: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    slack_ns: int = 0
    device: object = None  # device.DeviceWork
    no_device: str = ""
    ends_elsewhere: tuple[np.ndarray, np.ndarray] = field(
        default_factory=lambda: (np.zeros(0, np.int64), np.zeros(0, np.int64)))
    order: np.ndarray | None = None
    malformed: object = None  # readers.malformed.Skipped: the events the reader skipped
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.start)

    @property
    def depth(self) -> np.ndarray:
        """Each range's number of ancestors (computed on first use: the analysis needs none)."""
        if "depth" not in self._cache:
            self._cache["depth"] = depths(self.parent, self.order)
        return self._cache["depth"]

    @property
    def duration(self) -> np.ndarray:
        return self.end - self.start

    @property
    def thread_index(self) -> np.ndarray:
        """Each row's thread as its index into `threads`."""
        return self.group if self.n_subs == 1 else self.group // self.n_subs

    def thread_of(self, rows) -> np.ndarray:
        """The threads (globalTid) of these rows."""
        return self.threads[self.group[rows] // self.n_subs]

    @property
    def thread(self) -> np.ndarray:
        """Each row's thread (a column as long as the table: for small tables and tests)."""
        return self.threads[self.thread_index]

    @property
    def end_thread(self) -> np.ndarray:
        """The thread each row ends on (as `thread`, a whole column)."""
        out = self.thread
        rows, threads = self.ends_elsewhere
        out[rows] = threads
        return out

    @property
    def process(self) -> np.ndarray:
        return (self.thread >> 24) & 0xFFFFFF

    def rows_by_group(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, off): each nesting group's rows in nesting order (by start), group g's at
        rows[off[g]:off[g + 1]] (a column as long as the table, made for each caller)."""
        return by_group(walk_of(len(self), self.order), self.group,
                        len(self.threads) * self.n_subs)

    def ids_of(self, *wanted: str) -> np.ndarray:
        """The name ids of these catalogue names (absent names are skipped)."""
        # A dict of every name would cost a hash per name: polars finds them.
        at = self.names_column().is_in(list(wanted)).arg_true().to_list()
        found = {self.names[i]: i for i in at}  # names are distinct
        return np.array([found[n] for n in wanted if n in found], dtype=np.int64)

    def names_column(self):
        """`names` as a polars column (made on first use)."""
        import polars as pl

        if "names" not in self._cache:
            self._cache["names"] = pl.Series(self.names, dtype=pl.String)
        return self._cache["names"]

    def rows_named(self, *wanted: str) -> np.ndarray:
        """Row indices of the ranges with one of these names, in file order."""
        key = ("names",) + wanted
        if key not in self._cache:
            self._cache[key] = self.rows_with_ids(self.ids_of(*wanted))
        return self._cache[key]

    def find_rows(self, *groups: tuple[str, ...], id_sets: dict | None = None) -> None:
        """rows_named for each of these name groups at once, in one lookup per row; later
        rows_named calls find them. `id_sets`: {cache key: name ids} of more sets, their rows
        cached under those keys (a name in two sets: those sets are looked up on their own)."""
        keys = [("names",) + g for g in groups if ("names",) + g not in self._cache]
        sets = {key: self.ids_of(*key[1:]) for key in keys}
        sets.update((k, v) for k, v in (id_sets or {}).items() if k not in self._cache)
        slot_of = np.full(len(self.names), -1, np.int32)
        slots = []
        for key, ids in sets.items():
            if (slot_of[ids] >= 0).any():
                continue
            slot_of[ids] = len(slots)
            slots.append(key)
        if not slots:
            return
        rows, bounds = _rows_by_slot(self.name_id, slot_of, len(slots),
                                     np.zeros(0, position_type(len(self))))
        for j, key in enumerate(slots):
            self._cache[key] = rows[bounds[j]:bounds[j + 1]]

    def rows_with_ids(self, ids: np.ndarray) -> np.ndarray:
        """Row indices whose name id is one of `ids` (a lookup per row, however many ids), in
        32 bits where they fit."""
        slot_of = np.full(len(self.names), -1, np.int32)
        slot_of[ids] = 0
        return _rows_by_slot(self.name_id, slot_of, 1, np.zeros(0, position_type(len(self))))[0]

    def name_of(self, row: int) -> str:
        return self.names[int(self.name_id[row])]

    def data_frame(self):
        """The table as a polars DataFrame with string names (for small tables: tests, CSV)."""
        import polars as pl

        names = pl.Series("name", self.names, dtype=pl.String)
        domains = pl.Series("domain", self.domains, dtype=pl.String)
        return pl.DataFrame({
            "name": names.gather(self.name_id),
            "start": self.start, "end": self.end, "duration": self.duration,
            "kind": pl.Series(KIND_NAMES).gather(self.kind.astype(np.int64)),
            "process": self.process, "thread": self.thread,
            "end_thread": self.end_thread, "domain": domains.gather(np.ascontiguousarray(self.domain_id)),
            "unclosed": self.unclosed, "depth": self.depth, "parent": self.parent,
        })


@njit(cache=True, nogil=True)
def _rows_by_slot(name_id, slot_of, n_slots, like):
    """The rows whose name has a slot (slot_of[name id] >= 0), grouped by slot, each slot's in
    row order: rows[bounds[s]:bounds[s + 1]] (a counting sort; `like` gives the rows' type)."""
    bounds = np.zeros(n_slots + 1, np.int64)
    for i in range(len(name_id)):
        s = slot_of[name_id[i]]
        if s >= 0:
            bounds[s + 1] += 1
    for s in range(n_slots):
        bounds[s + 1] += bounds[s]
    at = bounds[:n_slots].copy()
    rows = np.empty(bounds[n_slots], like.dtype)
    for i in range(len(name_id)):
        s = slot_of[name_id[i]]
        if s >= 0:
            rows[at[s]] = i
            at[s] += 1
    return rows, bounds


def canonical_names(raw: list[str], used: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The canonical names of the raw names in use, in their order, and the map raw id ->
    canonical id (-1: not in use). One lookup per distinct name, none per row; the names are
    told apart by polars (a Python dict of a million names costs a hash and a slot each)."""
    import polars as pl

    at = np.flatnonzero(used[:len(raw)])
    names = list(map(raw.__getitem__, at.tolist()))
    column = pl.Series(names, dtype=pl.String)
    aliased = column.is_in(list(stages.ALIASES)).arg_true().to_list()
    for j in aliased:
        names[j] = stages.canonical(names[j])
    if aliased:
        column = pl.Series(names, dtype=pl.String)
    mapping = np.full(len(raw), -1, np.int32)
    if column.n_unique() == len(names):  # no name twice
        mapping[at] = np.arange(len(names))
        return names, mapping
    distinct = column.unique(maintain_order=True)
    mapping[at] = column.replace_strict(distinct, pl.int_range(len(distinct), eager=True),
                                        return_dtype=pl.Int32).to_numpy()
    return distinct.to_list(), mapping


def build(*, raw_names: list[str], name_id, start, end, kind, thread, end_thread=None,
          domain_id=None, domains=None, thread_names=None, process_names=None,
          source: str = "", clock: str = "", slack_ns: int = 0) -> RangeTable:
    """A RangeTable from loader columns; `end` < `start` marks a missing end (NULL in nsys);
    `end_thread` None where every range ends on its own thread, `domain_id` None where every
    range is in the default domain. `slack_ns`: the format's time resolution (see
    nesting.nest)."""
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    kind = np.asarray(kind, dtype=np.int8)
    thread = np.asarray(thread, dtype=np.int64)
    n = len(start)
    elsewhere = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if end_thread is not None:
        end_thread = np.asarray(end_thread, dtype=np.int64)
        rows = np.flatnonzero(end_thread != thread)
        elsewhere = (rows, end_thread[rows])
    # One zero seen as a column: the default domain costs no memory; a few domains, a byte a row.
    domain_id = (np.broadcast_to(np.int32(0), (n,)) if domain_id is None
                 else np.asarray(domain_id).astype(code_type(len(domains or [""])), copy=False))
    end, unclosed = _close(start, end, kind)
    nesting = Beside(_nested, thread, domain_id, kind, start, end, slack_ns)
    del thread
    name_id = np.asarray(name_id)
    used = np.bincount(name_id, minlength=len(raw_names)) > 0 if n else np.zeros(0, bool)
    names, mapping = canonical_names(raw_names, used)
    name_id = mapping[name_id] if n else np.zeros(0, np.int32)
    group, threads, n_subs, parent, crossing, order = nesting.result()
    return RangeTable(
        name_id=name_id, start=start, end=end, kind=kind, domain_id=domain_id,
        unclosed=unclosed, parent=parent, names=names, group=group, threads=threads,
        n_subs=n_subs, domains=list(domains or [""]), thread_names=dict(thread_names or {}),
        process_names=dict(process_names or {}), source=source, clock=clock,
        crossing=crossing, slack_ns=slack_ns, ends_elsewhere=elsewhere, order=order)


def _nested(thread, domain_id, kind, start, end, slack_ns: int):
    """The nesting groups and the nesting (on the second core while the names are read)."""
    group, threads, n_subs = nesting_groups(thread, domain_id, kind)
    del thread
    parent, crossing, order = nest(group, start, end, len(threads) * n_subs, slack_ns)
    # NVTX lets start/end ranges overlap (concurrent media fetches on one thread): no crossing.
    crossing = crossing[kind[crossing] != START_END].astype(np.int64)
    return group, threads, n_subs, parent, crossing, order


def nesting_groups(thread: np.ndarray, domain_id: np.ndarray, kind: np.ndarray):
    """Per row its nesting group (thread, domain, and start/end ranges apart from push/pop
    stacks: they overlap freely), the distinct threads, and the number of (domain, kind)
    pairs: group = thread index * n_subs + pair index."""
    t, threads = dense_codes(thread)
    if not (kind == START_END).any() and not domain_id.any():
        return t, threads, 1
    sub = (domain_id.astype(np.int64) << 1) | (kind == START_END)
    s, subs = dense_codes(sub)
    group = t.astype(np.int64) * len(subs) + s
    return group.astype(code_type(len(threads) * len(subs))), threads, len(subs)


def _close(start: np.ndarray, end: np.ndarray, kind: np.ndarray):
    """Marks end where they start; other missing ends become the last timestamp (unclosed)."""
    missing = end < start
    marks = kind == MARK
    none = np.broadcast_to(np.False_, missing.shape)  # the usual answer, in no memory
    if not missing.any() and not marks.any():
        return end, none
    end = end.copy()
    end[marks] = start[marks]
    unclosed = missing & ~marks
    if not unclosed.any():
        return end, none
    last = max(int(start.max()), int(end[~missing].max()) if (~missing).any() else 0)
    end[unclosed] = last
    return end, unclosed


def nest_with_crossings(thread: np.ndarray, sub: np.ndarray, start: np.ndarray,
                        end: np.ndarray, slack: int = 0):
    """Depth, parent row, and the rows that cross an earlier range, per (thread, sub) group.

    Rule (the oracle of tests/unit/test_analysis_nesting.py): order the group by (start,
    longest first, row); `p` contains `c` when p has positive length, p.start <= c.start < p.end
    and c.end <= p.end + slack (a format that rounds its times can put a child's end just
    after its parent's); the parent of `c` is the last range before it in that order that
    contains it. Ranges that overlap partly are not nested: each keeps the parent that contains
    it, and the later one is listed as crossing (an earlier sibling ends more than `slack`
    inside it). A zero-length range is a leaf, and at a parent's end it lies outside it; of two
    equal ranges the earlier row is the parent.
    """
    start = np.asarray(start, np.int64)
    end = np.asarray(end, np.int64)
    t, t_keys = dense_codes(thread)
    s, s_keys = dense_codes(sub)
    group = t.astype(np.int64) * max(len(s_keys), 1) + s
    parent, crossing, order = nest(group, start, end, max(len(t_keys) * len(s_keys), 1), slack)
    return depths(parent, order), parent, crossing.astype(np.int64)


def group_index(thread: np.ndarray, sub: np.ndarray | None = None) -> np.ndarray:
    """A dense id per (thread, sub) pair, or per thread; profiles have few threads, so lookups
    are cheap."""
    t_keys = distinct(thread)
    s_keys = distinct(sub) if sub is not None else t_keys[:1]
    g = np.searchsorted(t_keys, thread)
    if len(s_keys) > 1:
        g *= len(s_keys)
        g += np.searchsorted(s_keys, sub)
    # The narrowest type: a quarter of the memory, and a radix sort in packed_order.
    for narrow in (np.int16, np.int32):
        if len(t_keys) * len(s_keys) <= np.iinfo(narrow).max:
            return g.astype(narrow)
    return g


def distinct(values: np.ndarray) -> np.ndarray:
    """np.unique(values) without sorting them all: a value's rows come in runs (a profile
    writes a thread's ranges together), and the distinct values are those of the runs' heads."""
    if len(values) == 0:
        return values[:0]
    heads = np.flatnonzero(values[1:] != values[:-1])
    return np.unique(np.concatenate([values[:1], values[heads + 1]]))


def packed_keys(g: np.ndarray, s: np.ndarray, e: np.ndarray, pad: int = 0):
    """(group, time) packed into one int64, so that one sort or search serves every group;
    times count from `pad` within a group (a key less up to `pad` stays in its group)."""
    t0 = int(s.min()) - pad
    bits = max(int(e.max()) - t0, 1).bit_length()
    if int(g.max()).bit_length() + bits <= 62:
        high = g.astype(np.int64) << bits
        ks = s - t0
        ks |= high
        if e is s:  # keys of one time column (as-of searches): packed once
            return ks, ks
        ke = e - t0
        ke |= high
        return ks, ke
    # Very long profiles or very many threads: times become their ranks, which keep the order
    # but not a slack (the traces that have one span hours at most: 43 bits of nanoseconds).
    if pad:
        raise ValueError("a profile too long to nest with a time slack")
    times, inverse = np.unique(np.concatenate([s, e]), return_inverse=True)
    bits = max(int(len(times)).bit_length(), 1)
    if int(g.max()).bit_length() + bits > 62:
        raise ValueError("too many threads and timestamps to nest")
    high = g.astype(np.int64) << bits
    return high | inverse[:len(s)], high | inverse[len(s):]


@njit(cache=True, nogil=True)
def _asof(rows, right, group, n_subs, start, n_threads, out):
    """out[i]: the position in `right` of the last range on the thread of rows[i] starting at
    or before it (of equal starts, the last in `right`'s order), -1: none. Each thread's right
    side is put in start order (sorted only where it is not); each search goes on from where
    the thread's last ended while the rows move forward in time."""
    right_start = start[right]
    right_thread = np.empty(len(right), np.int64)
    for j in range(len(right)):
        right_thread[j] = group[right[j]] // n_subs
    off = offsets(right_thread, n_threads)
    at = off[:n_threads].copy()
    pos = np.empty(len(right), np.int64)
    for j in range(len(right)):
        t = right_thread[j]
        pos[at[t]] = j
        at[t] += 1
    sort_segments(pos, off[:n_threads + 1], right_start)
    cur = off[:n_threads] - 1  # per thread: its last right range at or before its last search
    last = np.full(n_threads, np.iinfo(np.int64).min, np.int64)
    for i in range(len(rows)):
        t, s = group[rows[i]] // n_subs, start[rows[i]]
        lo, hi = off[t], off[t + 1]
        cur[t] = seek(right_start, pos, lo, hi, cur[t], last[t], s)
        last[t] = s
        out[i] = pos[cur[t]] if cur[t] >= lo else NO_PARENT


def asof(table: RangeTable, rows: np.ndarray, right: np.ndarray) -> np.ndarray:
    """For each of `rows`, the position in `right` (rows of the same table) of the last range
    on its thread starting at or before it (of equal starts, the last in `right`'s order), -1
    where none: an as-of join on thread and time."""
    out = np.empty(len(rows), np.int64)
    _asof(rows, right, table.group, table.n_subs, table.start, len(table.threads), out)
    return out


def packed_order(g: np.ndarray, ks: np.ndarray):
    """np.argsort(ks, kind="stable") for keys packed as (group, time), and the keys in that
    order.

    Profiles list each thread's ranges in start order, so a radix sort of the small group ids
    (group_index gives them in 16 bits where they fit) mostly sorts the keys already; the full
    sort runs only where it did not."""
    order = np.argsort(g, kind="stable").astype(position_type(len(g)), copy=False)
    sk = ks[order]
    if len(sk) > 1 and (sk[1:] < sk[:-1]).any():
        # Within a group the rows are still in row order, so ties stay by row.
        fix = np.argsort(sk, kind="stable")
        order, sk = order[fix], sk[fix]
    return order, sk


@njit(cache=True, nogil=True)
def _climb(parent, is_outer, inner, found):
    for j in range(len(inner)):
        up = parent[inner[j]]
        while up >= 0 and not is_outer[up]:
            up = parent[up]
        found[j] = up


def enclosing(table: RangeTable, outer: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """For each inner row, its nearest ancestor among the outer rows (-1 if none): the
    containment the nesting found, each parent chain climbed in one compiled pass."""
    found = np.full(len(inner), NO_PARENT, dtype=position_type(len(table)))
    if len(inner) == 0 or len(outer) == 0:
        return found
    is_outer = np.zeros(len(table), bool)
    is_outer[outer] = True
    _climb(table.parent, is_outer, np.asarray(inner), found)
    return found
