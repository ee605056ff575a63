"""`mmscope cache-size LOG`: the encoder-cache hit rate at every capacity, replayed from an access
log (MMSCOPE_ACCESS_LOG), and the capacity a target hit rate needs; heavy imports wait for run().
"""
from __future__ import annotations

import argparse
import json
import sys

from mmscope.errors import UserError

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
EPILOG = """\
The model replays vLLM 0.32's EncoderCacheManager rule: entries referenced by a running request
are never evicted; unreferenced ones stay resident and are evicted oldest-freed first, only when
space is needed. It simplifies: a request's reference to an item is dropped right after the access
(vLLM: once the item's tokens are computed; --release end holds it to request end instead); the
log's order and concurrency are kept (at a smaller cache vLLM would defer items and run fewer
requests at once); connector hits stay hits; each engine is replayed on its own and hits are added
up, every engine at the given capacity.
"""
RELEASE_HELP = ("when the model drops a request's reference to an item: 'access' right after the "
                "access (default; vLLM drops it once the item's tokens are computed, which is "
                "soon after), 'end' at the request's F line (finish or preemption)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("log", help="access log written with MMSCOPE_ACCESS_LOG=FILE")
    parser.add_argument("--capacities", nargs="+", metavar="N",
                        help="capacities in embedding tokens, comma- or space-separated (default: "
                             "the largest item, powers of two up to where the hit rate stops "
                             "growing, and the recorded capacity)")
    parser.add_argument("--target-hit-rate", type=float, default=0.8, metavar="R",
                        help="hit rate to size for, 0-1 (default 0.8)")
    parser.add_argument("--hidden-size", type=int, metavar="H",
                        help="width of one cached embedding (the language model's hidden size "
                             "for LLaVA-style models): adds bytes to every capacity")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bfloat16",
                        help="dtype of the cached embeddings (default bfloat16)")
    parser.add_argument("--release", choices=("access", "end"), default="access", help=RELEASE_HELP)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", metavar="FILE", help="write the curve as PNG, SVG or PDF")


def run(args) -> int:
    from mmscope.cache_size import model, trace

    target = _target(args.target_hit_rate)
    per_token = _bytes_per_token(args)
    log = trace.load(args.log)
    c = model.curve(log, args.release)
    grid = _capacities(args.capacities, c)
    result = report(log, c, grid, target, per_token, args)
    if args.plot:
        from mmscope.cache_size.plot import write_plot

        write_plot(c, result, args.plot)
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print_table(result)
    if args.plot:
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _target(value: float) -> float:
    if not 0 < value <= 1:
        raise UserError(f"--target-hit-rate: {value} is not a hit rate between 0 and 1")
    return value


def _bytes_per_token(args) -> int | None:
    if args.hidden_size is None:
        return None
    if args.hidden_size <= 0:
        raise UserError(f"--hidden-size: {args.hidden_size} is not a positive width")
    return args.hidden_size * DTYPE_BYTES[args.dtype]


def _capacities(values: list[str] | None, c) -> list[int]:
    if not values:
        return c.default_grid()
    out = set()
    for part in ",".join(values).split(","):
        if not part.strip():
            continue
        try:
            n = int(part)
        except ValueError:
            raise UserError(f"--capacities: {part!r} is not a whole number of embeddings") from None
        if n < c.largest_item:
            raise UserError(f"--capacities: {n} is below the largest item ({c.largest_item} "
                            "embeddings), which vLLM's encoder cache must hold")
        out.add(n)
    if not out:
        raise UserError("--capacities: no capacity given")
    return sorted(out)


def report(log, c, grid: list[int], target: float, per_token: int | None, args) -> dict:
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
        "hidden_size": args.hidden_size,
        "dtype": args.dtype if per_token else None,
        "engines": [{"engine": e.engine, "capacity_tokens": e.capacity, "queries": e.accesses,
                     "hits": e.hits} for e in log.engines.values()],
    }


def print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console() if sys.stdout.isatty() else Console(width=120)
    print(_heading(r), flush=True)
    table = Table(box=None, pad_edge=False)
    table.add_column("capacity (embeds)", justify="right")
    if r["bytes_per_token"]:
        table.add_column(f"bytes ({r['hidden_size']} x {r['dtype']})", justify="right")
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


def main(argv: list[str] | None = None) -> int:
    """`python -m mmscope.cache_size.command ...` is `mmscope cache-size ...`."""
    from mmscope.cli import main as cli_main

    return cli_main(["cache-size", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
