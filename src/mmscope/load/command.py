"""`mmscope load --url URL`: sweep reuse levels against live OpenAI-compatible servers (one plan
spread over every --url, and over processes with --shard) and check their encoder-cache counters,
from their /metrics or from Prometheus, against the plan; exit 1 on hits missing that nothing
explains.
"""
from __future__ import annotations

import argparse
import json
import random
import sys

from mmscope.analyze.readers.scrape import seconds
from mmscope.errors import UserError, check_output_file

DEFAULT_REUSE = "0,0.5,0.9"
DEFAULT_IMAGE_SIZE = "224x224"
UNEXPLAINED_EXIT = 1
PLOT_FORMATS = ("png", "svg", "pdf")
# Upper bounds: the plan is built in memory before the first request, each concurrent request is
# a task, no model's length is beyond a 32-bit max_tokens, a seed is a 64-bit integer, and a
# timeout must fit the socket layer's timeval.
MAX_LEVELS = 100
MAX_REQUESTS = 100_000
MAX_IMAGES_PER_LEVEL = 1_000_000
MAX_IMAGES_PER_REQUEST = 256
MAX_CONCURRENCY = 10_000
MAX_URLS = 1000
RESERVED_FILES = 64  # open files beside the connections: the interpreter's, the media server's
MAX_TOKENS = 2**31 - 1
MAX_SEED = 2**63 - 1
MAX_TIMEOUT_S = 7 * 86400.0
_seconds = seconds(MAX_TIMEOUT_S)
MAX_MEDIA_LATENCY_S = 60.0  # a media server slower than this is beyond any client's timeout
DESCRIPTION = "verify the encoder cache under sweep load against a live server"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, action="append",
                        help="a server's base URL, e.g. http://127.0.0.1:8000; repeat it for "
                             "several instances: the plan is spread over them, each image's "
                             "every sight to one (only these hosts and --prometheus are "
                             "contacted)")
    parser.add_argument("--shard", type=shard, default=None, metavar="K/N",
                        help="send part K of N of the plan (N processes, one plan: the same "
                             "--seed and the same number of --url in each), every sight of an "
                             "image in one part; each judges its own part")
    parser.add_argument("--prometheus", metavar="URL",
                        help="read the counters from the Prometheus that scrapes the instances "
                             "(as their increase over each level) instead of their /metrics: "
                             "for instances behind a router")
    parser.add_argument("--prometheus-match", type=_matcher, metavar="SELECTOR",
                        help="with --prometheus: the label matcher of the fleet's series, e.g. "
                             "'{job=\"vllm\"}' (default: every series)")
    parser.add_argument("--encoder-url", metavar="URL",
                        help="an encoder instance (EC connector producer) in front of --url, the "
                             "prefill/decode instance: each request's images go there first, as "
                             "vLLM's disaggregated-encoder proxy routes them")
    parser.add_argument("--model", help="served model name (default: the first of GET /v1/models)")
    parser.add_argument("--reuse", type=reuse_levels, default=reuse_levels(DEFAULT_REUSE),
                        metavar="R,R,...",
                        help=f"shares of images that repeat an earlier image of the level, each in "
                             f"[0, 1] (default: {DEFAULT_REUSE})")
    parser.add_argument("--requests", type=_within(1, MAX_REQUESTS), default=32, metavar="N",
                        help="requests per level (default: 32)")
    parser.add_argument("--images-per-request", type=_within(1, MAX_IMAGES_PER_REQUEST), default=1,
                        metavar="K",
                        help="images in each request (default: 1)")
    parser.add_argument("--concurrency", type=_within(1, MAX_CONCURRENCY), default=4, metavar="C",
                        help="requests in flight at once (default: 4)")
    parser.add_argument("--image-size", type=image_size, default=image_size(DEFAULT_IMAGE_SIZE),
                        metavar="WxH", help=f"synthetic image size (default: {DEFAULT_IMAGE_SIZE})")
    parser.add_argument("--seed", type=_within(0, MAX_SEED), metavar="S",
                        help="seed of the images and prompts (default: a new one per run, printed, "
                             "since a server still holds the images of a run with the same seed)")
    parser.add_argument("--max-tokens", type=_within(1, MAX_TOKENS), default=4, metavar="T",
                        help="tokens generated per request (default: 4)")
    parser.add_argument("--timeout", type=_seconds, default=600.0, metavar="SECONDS",
                        help="give up after this long in all (default: 600)")
    parser.add_argument("--request-timeout", type=_seconds, default=120.0, metavar="SECONDS",
                        help="give up on a request after this long (default: 120)")
    parser.add_argument("--prefix", action="store_true",
                        help="the prefix plan: repeats resend an earlier request whole, images "
                             "first and a long text after them, so that with vLLM's prefix caching "
                             "(on by default) repeated images are spared as prefix-covered items")
    parser.add_argument("--media", type=media_sources, default=("data_url",), metavar="SOURCES",
                        help="how requests carry their images: data_url (base64 inline), http "
                             "(URLs of a media server load runs on loopback, as clients link "
                             "images), or data_url,http (requests take turns) (default: data_url)")
    parser.add_argument("--media-latency", type=duration, default=0.0, metavar="DURATION",
                        help="the media server's time to answer, e.g. 200ms or 0.5s (default: "
                             "0); with --media http")
    parser.add_argument("--media-jitter", type=duration, default=0.0, metavar="DURATION",
                        help="each answer's time drawn uniformly within the latency +/- this, "
                             "at most the latency (default: 0)")
    parser.add_argument("--media-format", choices=("png", "jpeg"), default="png",
                        help="the images' file format, inline or served (default: png)")
    parser.add_argument("--media-vary-urls", action="store_true",
                        help="with http: every request its own URL for each image, repeats too "
                             "(the same content under new URLs, as signed or versioned links)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of tables")
    parser.add_argument("--plot", metavar="FILE",
                        help="write hit rate and TTFT against reuse as PNG, SVG or PDF")


def reuse_levels(text: str) -> list[float]:
    try:
        levels = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}") from None
    if not levels or any(not 0 <= r <= 1 for r in levels):
        raise argparse.ArgumentTypeError(f"reuse levels must lie in [0, 1]: {text!r}")
    if len(levels) > MAX_LEVELS:
        raise argparse.ArgumentTypeError(f"at most {MAX_LEVELS} reuse levels: {text!r}")
    return levels


def shard(text: str):
    """`K/N`, 1 <= K <= N: part K of N."""
    from mmscope.load.fleet import Shard

    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K/N, e.g. 1/4: {text!r}") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"K/N needs 1 <= K <= N: {text!r}")
    if n > MAX_URLS:
        raise argparse.ArgumentTypeError(f"at most {MAX_URLS} shards: {text!r}")
    return Shard(k - 1, n)


def _matcher(text: str) -> str:
    from mmscope.load.observed.prometheus import matcher

    try:
        return matcher(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def media_sources(text: str) -> tuple[str, ...]:
    from mmscope.load.media_urls import SOURCES

    sources = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [s for s in sources if s not in SOURCES]
    if not sources or unknown:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(SOURCES)} (comma-separated): "
                                         f"{text!r}")
    return sources


def duration(text: str) -> float:
    """Seconds from `200ms`, `0.5s` or `0.5` (seconds)."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)?\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"expected a duration such as 200ms or 0.5s: {text!r}")
    seconds = float(m[1]) / (1000 if m[2] == "ms" else 1)
    if seconds > MAX_MEDIA_LATENCY_S:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_MEDIA_LATENCY_S:g} s: {text!r}")
    return seconds


def image_size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(n) for n in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, e.g. 224x224: {text!r}") from None
    if not (1 <= width <= 4096 and 1 <= height <= 4096):
        raise argparse.ArgumentTypeError(f"image sides must lie in 1..4096: {text!r}")
    return width, height


def _within(low: int, high: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}: {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}: {text!r}")
        return value
    return parse


def _check_before_planning(args: argparse.Namespace) -> None:
    """What argparse cannot see alone: the URLs, the plan's size, the plot's path."""
    from mmscope.load.client import base_url

    urls = [base_url(url) for url in args.url]
    if len(set(urls)) < len(urls):
        raise UserError(f"--url {next(u for u in urls if urls.count(u) > 1)} is given twice")
    if len(urls) > MAX_URLS:
        raise UserError(f"at most {MAX_URLS} --url")
    if args.encoder_url is not None:
        base_url(args.encoder_url, "--encoder-url")
        if len(urls) > 1 or args.prometheus:
            raise UserError("--encoder-url pairs with one --url, its counters read from /metrics "
                            "(no --prometheus)")
    if args.prometheus is not None:
        base_url(args.prometheus, "--prometheus")
    elif args.prometheus_match is not None:
        raise UserError("--prometheus-match needs --prometheus (the Prometheus it asks)")
    if args.shard is not None and args.shard.count > 1 and args.seed is None:
        raise UserError("--shard needs --seed: every shard builds the same plan from it")
    if args.requests * args.images_per_request > MAX_IMAGES_PER_LEVEL:
        raise UserError(f"--requests {args.requests} of --images-per-request "
                        f"{args.images_per_request} is more than {MAX_IMAGES_PER_LEVEL:,} images "
                        "per level")
    if args.plot:
        check_output_file(args.plot, "--plot", PLOT_FORMATS)
    http = "http" in args.media
    for flag, given in (("--media-latency", args.media_latency), ("--media-jitter", args.media_jitter),
                        ("--media-vary-urls", args.media_vary_urls)):
        if given and not http:
            raise UserError(f"{flag} needs --media http (the media server it sets)")
    for url in args.url:
        if http and not _loopback(url):
            raise UserError(f"--media http serves the images on this machine's loopback: --url "
                            f"{url} must be a server on this machine (127.0.0.1, localhost)")
    if args.media_jitter > args.media_latency:
        raise UserError(f"--media-jitter {args.media_jitter * 1000:g}ms is more than "
                        f"--media-latency {args.media_latency * 1000:g}ms")


def _loopback(url: str) -> bool:
    import ipaddress

    import yarl

    host = yarl.URL(url.strip()).host
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _allow_connections(concurrency: int, connections: int) -> None:
    """Raise this process's open-file limit to what `connections` need, within its hard limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = connections + RESERVED_FILES
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise UserError(f"--concurrency {concurrency} needs {need} open files; this process may "
                        f"open {hard} (ulimit -Hn)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def connections(args: argparse.Namespace) -> int:
    """Every request in flight, and a reading of each server's /metrics beside them."""
    return args.concurrency + 2 * len(args.url) + 2


def run(args: argparse.Namespace) -> int:
    import asyncio
    import dataclasses

    from mmscope.load import plan, report
    from mmscope.load.fleet import Shard

    _check_before_planning(args)
    _allow_connections(args.concurrency, connections(args))
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    args.shard = args.shard or Shard(0)
    workload = plan.build(seed, args.reuse, args.requests, args.images_per_request, args.image_size,
                          prefix=args.prefix, image_format=args.media_format,
                          lanes=args.shard.lanes(len(args.url)))
    workload = dataclasses.replace(workload, levels=tuple(
        args.shard.part(level, len(args.url)) for level in workload.levels))
    try:
        info, levels = asyncio.run(asyncio.wait_for(_sweep(args, workload), args.timeout))
    except TimeoutError:
        raise UserError(f"the sweep did not finish within --timeout {args.timeout:g} s; raise it "
                        "or send fewer --requests") from None
    if args.json:
        json.dump(report.run_json(info, levels), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        report.print_terminal(info, levels)
    if args.plot:
        _write_plot(args.plot, levels)
    return 0 if all(level.verdict.ok for level in levels) else UNEXPLAINED_EXIT


async def _sweep(args, workload):
    import contextlib

    from mmscope.load import client
    from mmscope.load.media_urls import MediaOptions, Urls
    from mmscope.load.media_server import MediaServer
    from mmscope.load.report import RunInfo
    from mmscope.load.sweep import preflight, run_level

    options = MediaOptions(args.media, args.media_latency, args.media_jitter, args.media_vary_urls)
    async with client.session(connections(args)) as http:
        fleet = await _fleet(args, http)
        with (MediaServer(options.latency_s, options.jitter_s, workload.seed) if options.http
              else contextlib.nullcontext()) as media_server:
            urls = Urls(workload, options, media_server)
            target = await preflight(fleet, args.model, workload, args.max_tokens)
            levels = []
            with _progress(workload) as advance:
                for level in workload.levels:
                    levels.append(await run_level(fleet, target, workload, level,
                                                  args.concurrency, args.max_tokens, urls,
                                                  advance(level)))
    info = RunInfo(tuple(server.url for server in fleet.servers), target.model, workload.seed,
                   workload.requests, workload.images_per_request, args.concurrency,
                   workload.image_size, target.embeds_per_image, workload.prefix, options,
                   workload.image_format, fleet.shard, workload.lanes, fleet.counters.where())
    return info, levels


async def _fleet(args, http):
    """The servers to send to and where their counters are read."""
    from mmscope.load.client import Server
    from mmscope.load.epd import PairServer
    from mmscope.load.observed.prometheus import Prometheus
    from mmscope.load.observed.readings import Pages
    from mmscope.load.sweep import Fleet

    if args.encoder_url is not None:
        servers = [PairServer(args.encoder_url, args.url[0], http, args.request_timeout)]
    else:
        servers = [Server(url, http, args.request_timeout) for url in args.url]
    if args.prometheus is None:
        return Fleet(servers, Pages(servers), args.shard)
    counters = Prometheus(args.prometheus, args.prometheus_match or "{}", http,
                          args.request_timeout)
    await counters.check()
    return Fleet(servers, counters, args.shard)


class _progress:
    """A rich progress bar on stderr, one row per level, so stdout stays clean for --json."""

    def __init__(self, workload):
        from rich.console import Console
        from rich.progress import Progress

        console = Console(stderr=True)
        self.bar = Progress(console=console, transient=False, disable=not console.is_terminal)
        self.tasks = {lv.level: self.bar.add_task(f"reuse {lv.reuse:g}", total=len(lv.requests))
                      for lv in workload.levels}

    def __enter__(self):
        if self.bar.disable:  # nothing to show: no call a request
            return lambda level: None
        self.bar.start()
        return lambda level: lambda: self.bar.advance(self.tasks[level.level])

    def __exit__(self, *exc):
        self.bar.stop()


def _write_plot(path: str, levels) -> None:
    from mmscope.load.report import write_plot

    try:
        write_plot(path, levels)
    except OSError as e:
        raise UserError(f"--plot {path}: cannot write ({e.strerror or e})") from None
    print(f"wrote {path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """`python -m mmscope.load.command ...` is `mmscope load ...`, same errors and exit codes."""
    from mmscope.cli import main as cli_main

    return cli_main(["load", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
