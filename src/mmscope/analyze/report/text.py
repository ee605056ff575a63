"""Figures as people read them, shared by the terminal and the HTML report: durations, shares, the
device side, where a role runs, the tree's box-drawing prefixes.
"""
from __future__ import annotations


def fmt_ns(ns) -> str:
    """A duration as people read it: 850 ns, 12.3 µs, 4.56 ms, 1.23 s."""
    if ns is None:
        return "-"
    ns = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def fmt_share(share) -> str:
    return "" if share is None else f"{100 * share:.1f}%"


def device_text(d: dict) -> str:
    """The profile's device side in one line, or why it has none (said once)."""
    if not d["available"]:
        return f"device time: none ({d['reason']})"
    streams = ", ".join(f"{s['stream']} {s['ops']} ops" for s in d["streams"][:6])
    more = len(d["streams"]) - 6
    return (f"device time: {d['ops']} GPU ops ({d['source']}) on {streams}"
            + (f" and {more} more streams" if more > 0 else "")
            + "; device = the span of the ops a range launched, kernels = their summed time")


def where_text(role: str, processes: list[dict]) -> str:
    """The processes and threads of a role, named where the profile names them."""
    parts = []
    for p in processes:
        if p["role"] != role:
            continue
        threads = ", ".join(f"{t['tid']}" + (f" {t['name']}" if t["name"] else "")
                            for t in p["threads"])
        parts.append(f"pid {p['pid']}" + (f" {p['name']}" if p["name"] else "")
                     + f" (thread {threads})")
    return "; ".join(parts)


def tree_prefixes(nodes: list[dict]) -> list[str]:
    """Box-drawing prefixes of nodes listed depth first (├─, └─, │)."""
    last_child = {}
    for i, n in enumerate(nodes):
        last_child[n["parent"]] = i
    out, open_levels = [], []
    for i, n in enumerate(nodes):
        depth = n["depth"]
        del open_levels[depth:]
        if depth == 0:
            out.append("")
        else:
            is_last = last_child[n["parent"]] == i
            out.append("".join("│  " if o else "   " for o in open_levels[1:])
                       + ("└─ " if is_last else "├─ "))
        open_levels.append(depth == 0 or last_child[n["parent"]] != i)
    return out


def catalogued(name: str) -> bool:
    """A range of mmscope's stage catalogue (docs/design.md §3), which the tree never hides."""
    from mmscope import stages

    return (name in stages.ALL_FIXED
            or name.startswith((stages.HASH_PREFIX, stages.PROCESSOR_PREFIX, stages.MEDIA_PREFIX)))
