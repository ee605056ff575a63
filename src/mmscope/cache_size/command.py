"""`mmscope cache-size LOG`: the encoder-cache hit rate at every capacity, replayed from an access
log (MMSCOPE_ACCESS_LOG), and the capacity a target hit rate needs; heavy imports wait for run().
"""
from __future__ import annotations

import argparse
import json
import sys

from mmscope.errors import UserError, check_output_file

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
PLOT_FORMATS = ("png", "svg", "pdf")
MAX_HIDDEN_SIZE = 1 << 20  # wider than any model's hidden state: a typo, not a model
MAX_CAPACITY = 2**62  # the model's distances are int64; beyond this every repeat hits anyway
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
                        help="width of one cached embedding (the language model's input "
                             "embedding size): bytes beside every capacity (default: one "
                             "embedding's bytes as the engine recorded them in the log)")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bfloat16",
                        help="dtype of the cached embeddings, with --hidden-size (default "
                             "bfloat16)")
    parser.add_argument("--release", choices=("access", "end"), default="access", help=RELEASE_HELP)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", metavar="FILE", help="write the curve as PNG, SVG or PDF")


def run(args) -> int:
    from mmscope.cache_size import model, trace
    from mmscope.cache_size.report import print_table, report

    target = _target(args.target_hit_rate)
    given = _given_bytes(args)
    if args.plot:
        check_output_file(args.plot, "--plot", PLOT_FORMATS)
    log = trace.load(args.log)
    per_token, bytes_from = given or _logged_bytes(log)
    c = model.curve(log, args.release)
    grid = _capacities(args.capacities, c)
    result = report(log, c, grid, target, per_token, bytes_from)
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
        raise UserError(f"--target-hit-rate: {value:g} is outside (0, 1]: a target hit rate is "
                        "above 0 and at most 1")
    return value


def _given_bytes(args) -> tuple[int, str] | None:
    """(bytes of one embedding, where that comes from) from --hidden-size and --dtype."""
    if args.hidden_size is None:
        return None
    if not 0 < args.hidden_size <= MAX_HIDDEN_SIZE:
        raise UserError(f"--hidden-size: {args.hidden_size} is not a width between 1 and "
                        f"{MAX_HIDDEN_SIZE}")
    return args.hidden_size * DTYPE_BYTES[args.dtype], f"{args.hidden_size} x {args.dtype}"


def _logged_bytes(log) -> tuple[int | None, str | None]:
    """One embedding's bytes as the engine allocated them: its capacity line gives them."""
    per_token = log.bytes_per_embed
    return (per_token, f"{per_token} an embedding, the access log's") if per_token else (None, None)


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
        if n > MAX_CAPACITY:
            raise UserError(f"--capacities: {n} is above the largest capacity the model "
                            f"replays (2**62 embeddings)")
        out.add(n)
    if not out:
        raise UserError("--capacities: no capacity given")
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    """`python -m mmscope.cache_size.command ...` is `mmscope cache-size ...`."""
    from mmscope.cli import main as cli_main

    return cli_main(["cache-size", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
