"""The range table every loader produces and every computation reads, and the nesting that fills it.

One row per NVTX range or mark (or Chrome event); names are ids into a small canonical-name list.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mmscope import stages
from mmscope.analyze import kernels

PUSH_POP, START_END, MARK = 0, 1, 2
KIND_NAMES = ("push_pop", "start_end", "mark")
NO_PARENT = -1


@dataclass
class RangeTable:
    """Columns (numpy, one entry per range, in file order) plus the small lookup lists.

    `name_id` indexes `names` (canonical spellings, see `stages.canonical`); `domain_id` indexes
    `domains` ("" is the default domain); `thread` is nsys' globalTid (pid << 24 | tid); `parent`
    is the row index of the enclosing range or -1; `unclosed` rows had no end (their end is the
    profile's last timestamp, as nsys' own reports do).
    """

    name_id: np.ndarray
    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray
    thread: np.ndarray
    end_thread: np.ndarray
    domain_id: np.ndarray
    unclosed: np.ndarray
    depth: np.ndarray
    parent: np.ndarray
    names: list[str]
    domains: list[str] = field(default_factory=lambda: [""])
    thread_names: dict[int, str] = field(default_factory=dict)
    process_names: dict[int, str] = field(default_factory=dict)
    source: str = ""
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.start)

    @property
    def duration(self) -> np.ndarray:
        return self.end - self.start

    @property
    def process(self) -> np.ndarray:
        return (self.thread >> 24) & 0xFFFFFF

    def ids_of(self, *wanted: str) -> np.ndarray:
        """The name ids of these catalogue names (absent names are skipped)."""
        if "index" not in self._cache:
            self._cache["index"] = {n: i for i, n in enumerate(self.names)}
        index = self._cache["index"]
        return np.array([index[n] for n in wanted if n in index], dtype=np.int64)

    def rows_named(self, *wanted: str) -> np.ndarray:
        """Row indices of the ranges with one of these names, in file order."""
        key = ("names",) + wanted
        if key not in self._cache:
            self._cache[key] = self.rows_with_ids(self.ids_of(*wanted))
        return self._cache[key]

    def find_rows(self, *groups: tuple[str, ...], id_sets: dict | None = None) -> None:
        """rows_named for each of these name groups at once (one pass where the C kernels
        are built); later rows_named calls find them. `id_sets`: {cache key: name ids} of
        more sets, their rows cached under those keys."""
        keys = [("names",) + g for g in groups if ("names",) + g not in self._cache]
        sets = {key: self.ids_of(*key[1:]) for key in keys}
        sets.update((k, v) for k, v in (id_sets or {}).items() if k not in self._cache)
        if not sets or kernels.lib() is None or len(self.names) >= (1 << 31):
            return
        slot_of = np.full(len(self.names), -1, np.int32)
        slots = []
        for key, ids in sets.items():
            if (slot_of[ids] >= 0).any():  # a name in two sets: those go one by one
                continue
            slot_of[ids] = len(slots)
            slots.append(key)
        for key, rows in zip(slots, kernels.rows_by_slot(self.name_id, slot_of, len(slots))):
            self._cache[key] = rows

    def rows_with_ids(self, ids: np.ndarray) -> np.ndarray:
        """Row indices whose name id is one of `ids` (a lookup per row, however many ids)."""
        if len(ids) == 0:
            return np.zeros(0, dtype=np.int64)
        if len(ids) == 1:
            return np.flatnonzero(self.name_id == ids[0])
        wanted = np.zeros(len(self.names), dtype=bool)
        wanted[ids] = True
        return np.flatnonzero(wanted[self.name_id])

    def name_of(self, row: int) -> str:
        return self.names[int(self.name_id[row])]

    def frame(self):
        """The table as a polars DataFrame with string names (for small tables: tests, CSV)."""
        import polars as pl

        names = pl.Series("name", self.names, dtype=pl.String)
        domains = pl.Series("domain", self.domains, dtype=pl.String)
        return pl.DataFrame({
            "name": names.gather(self.name_id),
            "start": self.start, "end": self.end, "duration": self.duration,
            "kind": pl.Series(KIND_NAMES).gather(self.kind.astype(np.int64)),
            "process": self.process, "thread": self.thread,
            "end_thread": self.end_thread, "domain": domains.gather(self.domain_id),
            "unclosed": self.unclosed, "depth": self.depth, "parent": self.parent,
        })


def canonical_names(raw: list[str]) -> tuple[list[str], np.ndarray]:
    """Canonical name list and the map raw id -> canonical id (aliases merge into one name)."""
    index, mapping = _canonical_index(raw)
    return list(index), mapping


def canonical_prefix(raw: list[str]) -> tuple[dict[str, int], list[int]]:
    """The canonical index and codes of the first raw names, computed ahead (build continues
    them with the rest)."""
    index: dict[str, int] = {}
    canonical = stages.canonical
    return index, [index.setdefault(canonical(name), len(index)) for name in raw]


def _canonical_index(raw: list[str], prefix=None) -> tuple[dict[str, int], np.ndarray]:
    """{canonical name: id} in first-appearance order, and the map raw id -> canonical id;
    `prefix`: canonical_prefix() of the first raw names (taken over, not copied)."""
    index, codes = prefix if prefix is not None else ({}, [])
    canonical = stages.canonical
    # One list, then one array: a numpy item assignment per name costs more than the lookup.
    codes = codes + [index.setdefault(canonical(name), len(index)) for name in raw[len(codes):]]
    return index, np.array(codes, dtype=np.int64).reshape(len(raw))


def build(*, raw_names: list[str], name_id, start, end, kind, thread, end_thread=None,
          domain_id=None, domains=None, thread_names=None, process_names=None,
          source: str = "", canonical=None) -> RangeTable:
    """A RangeTable from loader columns; `end` < `start` marks a missing end (NULL in nsys).
    `canonical`: canonical_prefix() of the first raw names, where the loader computed it."""
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    kind = np.asarray(kind, dtype=np.int8)
    thread = np.asarray(thread, dtype=np.int64)
    n = len(start)
    # Columns are never written after build: where every range ends on its own thread, the two
    # columns can be one array.
    end_thread = thread if end_thread is None else np.asarray(end_thread, dtype=np.int64)
    domain_id = np.zeros(n, np.int32) if domain_id is None else np.asarray(domain_id, np.int32)
    end, unclosed = _close(start, end, kind)
    # Start/end ranges overlap freely, so they nest among themselves, apart from push/pop stacks.
    nesting = None
    if kernels.lib() is not None and n:
        # C without the GIL, while this thread maps the names.
        nesting = kernels.Background(_nest_c, thread, None, start, end,
                                     np.empty(n, np.int32), np.empty(n, np.int64),
                                     (domain_id, kind, START_END))
    index, mapping = _canonical_index(raw_names, canonical)
    names = list(index)
    name_id = mapping.astype(np.int32)[np.asarray(name_id)] if n else np.zeros(0, np.int32)
    if nesting is not None:
        depth, parent = nesting.result()
    else:
        sub = (domain_id << 1) | (kind == START_END)
        depth, parent = nest(thread, sub, start, end)
        del sub
    return RangeTable(
        name_id=name_id,
        start=start, end=end, kind=kind, thread=thread, end_thread=end_thread,
        domain_id=domain_id, unclosed=unclosed, depth=depth, parent=parent, names=names,
        domains=list(domains or [""]), thread_names=dict(thread_names or {}),
        process_names=dict(process_names or {}), source=source,
        _cache={"index": index})  # ids_of's lookup, which profiles with many names pay for


def _close(start: np.ndarray, end: np.ndarray, kind: np.ndarray):
    """Marks end where they start; other missing ends become the last timestamp (unclosed)."""
    missing = end < start
    marks = kind == MARK
    if not missing.any() and not marks.any():
        return end, missing
    end = end.copy()
    end[marks] = start[marks]
    unclosed = missing & ~marks
    if unclosed.any():
        last = max(int(start.max()), int(end[~missing].max()) if (~missing).any() else 0)
        end[unclosed] = last
    return end, unclosed


def nest(thread: np.ndarray, sub: np.ndarray, start: np.ndarray, end: np.ndarray):
    """Depth and parent row of every interval within its (thread, sub) group, without a stack.

    Rule (the stack rule of tests/test_analysis_nesting.py): sort by (start, longest first, row);
    `p` contains `c` when p has positive length, p.start <= c.start < p.end and c.end <= p.end.
    A zero-length range is a leaf and at a parent's end it lies outside it (nsys counts it inside);
    of two equal ranges the earlier row is the parent (nsys may pick either).
    """
    n = len(start)
    depth = np.zeros(n, dtype=np.int32)
    parent = np.full(n, NO_PARENT, dtype=np.int64)
    if n == 0:
        return depth, parent
    if kernels.lib() is not None:
        return _nest_c(thread, kernels.c_array(sub, np.int32), start, end, depth, parent)
    g = _group_index(thread, sub)
    ks_row, ke_row = _packed_keys(g, start, end)
    order, ks = _sort_order(ks_row, ke_row, g)
    del g, ks_row
    ke = ke_row[order]
    del ke_row
    # Everything in sorted positions first; rows only at the end (two scatters, one gather).
    positive = ke > ks
    if positive.all():
        d_sorted, p_sorted = _nest_positive(ks, ke)
    else:
        pos = np.flatnonzero(positive)
        zero = np.flatnonzero(~positive)
        ks_p, ke_p = ks[pos], ke[pos]
        d_pos, p_pos = _nest_positive(ks_p, ke_p)
        d_zero, p_zero = _nest_zero(ks_p, ke_p, d_pos, p_pos, ks[zero])
        del ks_p, ke_p
        d_sorted = np.empty(n, np.int32)
        d_sorted[pos], d_sorted[zero] = d_pos, d_zero
        p_sorted = np.full(n, NO_PARENT, np.int64)
        if len(pos):
            p_sorted[pos] = _through(pos, p_pos)
            p_sorted[zero] = _through(pos, p_zero)
    del ks, ke, positive
    depth[order] = d_sorted
    parent[order] = _through(order, p_sorted)
    return depth, parent


def _nest_c(thread, sub, start, end, depth, parent, domain_kind=None):
    """nest() in C: one pass in row order where each (thread, sub) group's rows are in start
    order already (as profiles list them), else a pass in the order numpy sorts. Without
    `sub`, `domain_kind` gives it (see kernels.nest)."""
    thread, start, end = (kernels.c_array(a, np.int64) for a in (thread, start, end))
    if kernels.nest(thread, sub, start, end, depth, parent, domain_kind=domain_kind):
        return depth, parent
    if sub is None:
        domain_id, kind, start_end = domain_kind
        sub = (domain_id.astype(np.int32) << 1) | (kind == start_end)
    sub = kernels.c_array(sub, np.int32)
    g = _group_index(thread, sub)
    ks_row, ke_row = _packed_keys(g, start, end)
    order, _ = _sort_order(ks_row, ke_row, g)
    del ks_row, ke_row
    parent[:] = NO_PARENT
    kernels.nest(thread, sub, start, end, depth, parent, order=kernels.c_array(order, np.int64),
                 gid=kernels.c_array(g, np.int64), n_groups=int(g.max()) + 1)
    return depth, parent


def _through(index: np.ndarray, at: np.ndarray) -> np.ndarray:
    """index[at] where at >= 0, else NO_PARENT; overwrites `at`, which the caller gives up."""
    none = at < 0
    at[none] = 0
    out = index[at]
    out[none] = NO_PARENT
    return out


def _group_index(thread: np.ndarray, sub: np.ndarray) -> np.ndarray:
    """A dense id per (thread, sub) pair; profiles have few threads, so lookups are cheap."""
    import polars as pl

    t_keys = np.sort(pl.Series(thread).unique().to_numpy())
    s_keys = np.sort(pl.Series(sub).unique().to_numpy())
    g = np.searchsorted(t_keys, thread)
    if len(s_keys) > 1:
        g *= len(s_keys)
        g += np.searchsorted(s_keys, sub)
    return g


def _packed_keys(g: np.ndarray, s: np.ndarray, e: np.ndarray):
    """(group, time) packed into one int64, so that one sort or search serves every group."""
    t0 = int(s.min())
    bits = max(int(e.max()) - t0, 1).bit_length()
    if int(g.max()).bit_length() + bits <= 62:
        high = g << bits
        ks, ke = s - t0, e - t0
        ks |= high
        ke |= high
        return ks, ke
    # Very long profiles or very many threads: times become their ranks, which keep the order.
    times, inverse = np.unique(np.concatenate([s, e]), return_inverse=True)
    bits = max(int(len(times)).bit_length(), 1)
    if int(g.max()).bit_length() + bits > 62:
        raise ValueError("too many threads and timestamps to nest")
    return (g << bits) | inverse[:len(s)], (g << bits) | inverse[len(s):]


def packed_order(g: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """np.argsort(ks, kind="stable") for keys packed as (group, time).

    Profiles list each thread's ranges in start order, so a radix sort of the small group ids
    mostly sorts the keys already; the full sort runs only where it did not."""
    small = g.astype(np.int16) if len(g) and int(g.max()) < (1 << 15) else g
    order = np.argsort(small, kind="stable")
    del small
    sk = ks[order]
    if len(sk) > 1 and (sk[1:] < sk[:-1]).any():
        # Within a group the rows are still in row order, so ties stay by row.
        order = order[np.argsort(sk, kind="stable")]
    return order


def _sort_order(ks: np.ndarray, ke: np.ndarray, g: np.ndarray):
    """Rows by (group and start, end descending, row): one stable sort, then fix equal starts.
    Also the keys in that order (fixing ties moves rows only among equal keys)."""
    order = packed_order(g, ks)
    sk = ks[order]
    tied = np.flatnonzero(sk[1:] == sk[:-1])
    if len(tied):
        at = np.unique(np.concatenate([tied, tied + 1]))
        sub = order[at]
        order[at] = sub[np.lexsort((sub, -ke[sub], ks[sub]))]
    return order, sk


def _nest_positive(ks: np.ndarray, ke: np.ndarray):
    """Depth = ranges opened before me minus those closed by my start; parent = the last range
    opened before me one level up (exact for well-nested ranges)."""
    m = len(ks)
    if m == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int64)
    # Ends are nearly in start order already, which the stable (merge) sort exploits.
    depth = np.arange(m, dtype=np.int64)
    depth -= np.searchsorted(np.sort(ke, kind="stable"), ks, side="right")
    parent = np.full(m, NO_PARENT, dtype=np.int64)
    counts = np.bincount(depth)  # depth >= 0: what closed by my start opened before me
    levels = len(counts)
    if levels > 1:
        # The positions of each level, in order: a pass per level when there are few, else one
        # radix sort of the levels (small ints).
        if levels <= 8:
            at_level = [np.flatnonzero(depth == d) for d in range(levels)]
        else:
            by_level = np.argsort(depth.astype(np.int16) if levels < (1 << 15) else depth,
                                  kind="stable")
            at_level = np.split(by_level, np.cumsum(counts)[:-1])
        for d in range(1, levels):
            up, here = at_level[d - 1], at_level[d]
            k = np.searchsorted(up, here) - 1  # the last range one level up before me
            parent[here] = np.where(k >= 0, up[np.maximum(k, 0)], NO_PARENT)
    return depth.astype(np.int32), parent


def _nest_zero(ks_p, ke_p, depth_p, parent_p, kz):
    """A zero-length range's parent: the deepest positive range open at its time (start <= t < end).

    Keys of another group never qualify: a range of a lower group ends below every key of ours.
    """
    z = len(kz)
    if z == 0 or len(ks_p) == 0:
        return np.zeros(z, np.int32), np.full(z, NO_PARENT, np.int64)
    cand = np.searchsorted(ks_p, kz, side="right") - 1
    # Climb while the candidate closed at or before t; at most the nesting depth rounds.
    while True:
        live = np.flatnonzero(cand >= 0)
        stale = live[ke_p[cand[live]] <= kz[live]]
        if len(stale) == 0:
            break
        cand[stale] = parent_p[cand[stale]]
    depth = np.where(cand >= 0, depth_p[np.maximum(cand, 0)] + 1, 0).astype(np.int32)
    return depth, cand


def latest_before(table: RangeTable, outer: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """For each inner row, the outer row on the same thread that started last at or before it
    (-1 if none): the candidate enclosing range, or the step_meta a forward joins."""
    if len(inner) == 0 or len(outer) == 0:
        return np.full(len(inner), NO_PARENT, dtype=np.int64)
    found = None
    if kernels.lib() is not None:
        found = kernels.latest_before(outer, inner, table.thread, table.start)
    if found is None:
        found = _latest_before_packed(table, outer, inner)
    if found is not None:
        return found
    import polars as pl

    left = pl.DataFrame({"t": table.thread[inner], "s": table.start[inner],
                         "i": np.arange(len(inner))}).sort("s")
    right = pl.DataFrame({"t": table.thread[outer], "s": table.start[outer],
                          "o": outer.astype(np.int64)}).sort("s")
    joined = left.join_asof(right, on="s", by="t", strategy="backward", check_sortedness=False)
    found = np.full(len(inner), NO_PARENT, dtype=np.int64)
    found[joined["i"].to_numpy()] = joined["o"].fill_null(NO_PARENT).to_numpy()
    return found


def _latest_before_packed(table: RangeTable, outer: np.ndarray, inner: np.ndarray):
    """latest_before with (thread, start) packed into int64 keys: one sort of the outer rows
    (mostly a radix sort of thread ids: rows are in start order per thread) and one search.
    Of outer rows with equal keys the last in row order wins, as in the as-of join. None where
    the keys do not pack."""
    keys = np.unique(table.thread[outer])
    g_out = np.searchsorted(keys, table.thread[outer])
    g_in = np.minimum(np.searchsorted(keys, table.thread[inner]), len(keys) - 1)
    known = keys[g_in] == table.thread[inner]
    s_out, s_in = table.start[outer], table.start[inner]
    t0 = min(int(s_out.min()), int(s_in.min()))
    bits = max(int(s_out.max()) - t0, int(s_in.max()) - t0, 1).bit_length()
    if int(len(keys)).bit_length() + bits > 62:
        return None
    k_out = (g_out << bits) | (s_out - t0)
    order = packed_order(g_out, k_out)
    k_out = k_out[order]
    at = np.searchsorted(k_out, (g_in << bits) | (s_in - t0), side="right") - 1
    ok = known & (at >= 0)
    ok[ok] = (k_out[at[ok]] >> bits) == g_in[ok]
    found = np.full(len(inner), NO_PARENT, dtype=np.int64)
    found[ok] = outer[order[at[ok]]]
    return found
