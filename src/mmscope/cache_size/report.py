"""What `mmscope cache-size` shows: the curve, the recommendation and the recorded capacity as one
dict, which the JSON is, the terminal table reads and the plot marks.
"""
from __future__ import annotations



def report(log, c, grid: list[int], target: float, per_token: int | None,
           bytes_from: str | None) -> dict:
    """Everything the table, the JSON and the plot show."""
    def size(tokens):
        return None if tokens is None or per_token is None else tokens * per_token

    recommended = c.capacity_for(target)
    recorded = c.recorded_capacity
    return {
        "log": log.path,
        "release": c.release,
        "queries": c.queries,
        "repeats": c.repeats,
        "largest_item_tokens": c.largest_item,
        "curve": [{"capacity_tokens": n, "capacity_bytes": size(n), "hits": c.hits(n),
                   "hit_rate": c.hit_rate(n)} for n in grid],
        "target_hit_rate": target,
        "recommended_tokens": recommended,
        "recommended_bytes": size(recommended),
        "max_hit_rate": c.repeats / c.queries,
        "saturation_tokens": c.saturation,
        "saturation_bytes": size(c.saturation),
        "recorded_capacity_tokens": recorded,
        "recorded_capacity_bytes": size(recorded),
        "recorded_hit_rate": c.recorded_hits / c.queries,
        "model_hit_rate_at_recorded": c.hit_rate(recorded) if recorded else None,
        "bytes_per_token": per_token,
        "bytes_from": bytes_from,
        "engines": [{"engine": e.engine, "capacity_tokens": e.capacity, "queries": e.accesses,
                     "hits": e.hits} for e in log.engines.values()],
    }


def print_table(r: dict) -> None:
    from mmscope.console import report_console
    from rich.table import Table

    console = report_console()
    print(_heading(r), flush=True)
    table = Table(box=None, pad_edge=False)
    table.add_column("capacity (embeds)", justify="right")
    if r["bytes_per_token"]:
        table.add_column(f"bytes ({r['bytes_from']})", justify="right")
    table.add_column("hit rate", justify="right")
    table.add_column("hits", justify="right")
    table.add_column("")
    for row in r["curve"]:
        cells = [str(row["capacity_tokens"])]
        if r["bytes_per_token"]:
            cells.append(human_bytes(row["capacity_bytes"]))
        cells += [f"{100 * row['hit_rate']:.1f}%", str(row["hits"]), _marks(row, r)]
        table.add_row(*cells)
    console.print(table)
    print(_answer(r))


def _heading(r: dict) -> str:
    n = len(r["engines"])
    lines = [f"{r['log']}: {r['queries']} encoder-cache accesses, {r['repeats']} repeats, largest "
             f"item {r['largest_item_tokens']} embeds"
             + (f", {n} engines replayed separately (hits summed)" if n > 1 else "")]
    if r["recorded_capacity_tokens"]:
        lines.append(f"recorded at {r['recorded_capacity_tokens']} embeds: "
                     f"{100 * r['recorded_hit_rate']:.1f}% hits in the log, "
                     f"{100 * r['model_hit_rate_at_recorded']:.1f}% by the model")
    when = "each access" if r["release"] == "access" else "request end"
    lines.append("model: vLLM 0.32 eviction (unreferenced entries, oldest freed first), "
                 f"references released at {when}")
    return "\n".join(lines)


def _marks(row: dict, r: dict) -> str:
    marks = []
    if row["capacity_tokens"] == r["recorded_capacity_tokens"]:
        marks.append("recorded")
    if row["capacity_tokens"] == r["saturation_tokens"]:
        marks.append("every repeat hits")
    return ", ".join(marks)


def _answer(r: dict) -> str:
    want = f"{100 * r['target_hit_rate']:g}%"
    if r["recommended_tokens"] is None:
        return (f"{want} hits: unreachable on this traffic, only {100 * r['max_hit_rate']:.1f}% "
                f"of accesses are repeats (reached from {_size(r, 'saturation')})")
    return f"{want} hits: {_size(r, 'recommended')} or more"


def _size(r: dict, name: str) -> str:
    tokens, nbytes = r[f"{name}_tokens"], r[f"{name}_bytes"]
    return f"{tokens} embeds" + (f" ({human_bytes(nbytes)})" if nbytes is not None else "")


def human_bytes(n: int) -> str:
    units, x, i = ("B", "KiB", "MiB", "GiB", "TiB"), float(n), 0
    while x >= 1024 and i < len(units) - 1:
        x, i = x / 1024, i + 1
    return f"{n} B" if i == 0 else f"{x:.1f} {units[i]}"
