"""The work mmscope adds to vLLM, counted in instructions by Callgrind (docs/design.md §8's measure):
one in-process engine, batches of image chats, the plugin off, on with tracing off, and on with every
range on, interleaved, each batch counted on its own.

The chats go through `LLM.chat` with their images by URL, as a server's clients send them: data
URLs and http URLs of a media server on loopback (in the parent process, outside the count), by
turns, so vLLM's media connector, renderer and multimodal processor run as on the server, and with
them the rows that apply once media come by URL. `--images pil` counts the offline batch given PIL
images instead (`LLM.generate`): no media, render or processor-cache rows apply there.

A batch's wall time moves by about ±5% here (a shared 2-core machine); the instructions an engine
executes for the same batch repeat to about 0.3%, so each pair of batches resolves the added work to
a tenth of a percent. Printed: each configuration against the bare batch of its pair, and the
instructions added per request and per engine step, from which the cost on a real model's
20-50 ms step can be read off. --cache-sim adds a cycle estimate (Ir + 10 x L1 misses + 100 x LL
misses, the last level a core's 2 MiB share of a shared cache).

Run: .venv/bin/python bench/plugin_instructions.py [--images data_url,http|data_url|http|pil]
     [--runner v1|v2] [--pairs 3] [--max-tokens 16,128] [--requests 48] [--cache-sim] [--settle N]
     [--each-hook] [--otlp] [--keep DIR]  |  --report DIR [--requests 48] [--images ...]
--otlp: the engine traces requests (vLLM's --otlp-traces-endpoint) to an OTLP/gRPC receiver in this
process (tests/kit/otlp.py), so every configuration, the bare one too, pays vLLM's own tracing and
mmscope's figure is what it adds to vLLM's request spans; each counted batch ends by exporting its
spans (the tracer provider's force_flush), as the chrome traces are flushed.
--runner v2 counts vLLM's Model Runner V2, run on this CPU through Triton's interpreter (the test
suite's start-up, tests/kit/startup/runner_v2): its kernels, interpreted in Python, inflate the bare batch,
so read V2's cost from the instructions added per request and per step.
Under .venv-vllm034 (vLLM 0.34's own code, the suite's second environment) the engine is 0.34's:
--runner v2 (its x86 runner, through Triton's interpreter) or standalone (its runner for CPUs
without Triton, compiled ops only: the figure to read for 0.34), on tests/kit/startup/vllm034.
Needs Valgrind (Debian: apt-get install valgrind) and a C compiler (bench/callgrind_mark.c marks
the batches). Valgrind runs the engine about 130x slower: a 16-token batch takes about 25 s, a
128-token one about 2 minutes, the engine's start about a minute.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BARE = "without mmscope"
TRACING_OFF = "mmscope, tracing off"
EVERY_RANGE = "mmscope, every range on (chrome)"
WITHOUT = "tracing off, without "  # --each-hook: the whole plugin less one hook
# Under Valgrind a batch takes a hundred times longer, so the 1 s emission timer would fire a
# hundred times more often than in real time; with it set beyond a batch, each batch sends its
# counts as it would in real time: at its first step (instrument() starts the timer
# afresh) and when the engine runs dry.
EMISSION_TIMER_S = 3600.0
# The simulated last-level cache: a core's share on a shared machine rather than the whole L3
# Valgrind would read from the CPU (hundreds of MiB here, which nothing would miss).
LL_CACHE = "--LL=2097152,16,64"  # 2 MiB, 16-way, 64-byte lines
CYCLE_WEIGHTS = {"Ir": 1, "I1mr": 10, "D1mr": 10, "D1mw": 10, "ILmr": 100, "DLmr": 100,
                 "DLmw": 100}


def answer_lengths(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("answer lengths must be positive")
    return values


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


PIL = "pil"
URL_SOURCES = ("data_url", "http")  # what the media connector fetches (load/media_urls.py's words)


def image_sources(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if values == (PIL,) or (values and set(values) <= set(URL_SOURCES)):
        return values
    raise argparse.ArgumentTypeError(f"{text!r}: choose {PIL}, or URL sources among "
                                     f"{', '.join(URL_SOURCES)} (comma-separated, taken by turns)")


def image_seeds(batch_no: int, requests: int) -> list[int]:
    """Each request's image: a quarter of the requests repeat an earlier request's image (hits
    and misses both exercised); fresh images per batch, so that each batch does the same encoder
    and processor work."""
    base = 100_000 * batch_no
    return [base + (i // 2 if i % 2 else i) for i in range(requests)]


def url_sources(seeds: list[int], sources: tuple[str, ...]) -> list[str]:
    """Each request's URL source: the batch's images take the sources by turns in the order they
    first come; a repeat comes as its image came."""
    turn = {seed: sources[n % len(sources)] for n, seed in enumerate(dict.fromkeys(seeds))}
    return [turn[seed] for seed in seeds]


def batches_at_most(args) -> int:
    """The batches a run makes, at most (--each-hook: one configuration per row of the table)."""
    from mmscope.vllm.targets import TABLE

    configurations = 3 + (len(TABLE.rows) if args.each_hook else 0)
    return len(args.max_tokens) * (2 + args.pairs * configurations * (1 + args.settle))


def png(seed: int) -> bytes:
    import io

    from mmscope.demo.inputs import image

    buf = io.BytesIO()
    image(seed).save(buf, format="PNG")
    return buf.getvalue()


def served_name(seed: int) -> str:
    return f"{seed}.png"


def image_url(source: str, seed: int, media_url: str | None) -> str:
    if source == "http":
        from mmscope.load.media_server import PATH_PREFIX

        return f"{media_url}{PATH_PREFIX}{served_name(seed)}"
    import base64

    return "data:image/png;base64," + base64.b64encode(png(seed)).decode()


def workload_batch(batch_no: int, requests: int, images: tuple[str, ...],
                   media_url: str | None) -> list:
    """Single-image requests: chats whose image comes by URL, each image's source taken by
    turns (a repeat has its image's source), or prompts given PIL images."""
    seeds = image_seeds(batch_no, requests)
    if images == (PIL,):
        from mmscope.demo.inputs import image

        return [{"prompt": f"<s>user: <image>Question {i}?\nassistant:",
                 "multi_modal_data": {"image": image(seed)}} for i, seed in enumerate(seeds)]
    return [[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": image_url(source, seed, media_url)}},
        {"type": "text", "text": f"Question {i}?"}]}]
        for i, (seed, source) in enumerate(zip(seeds, url_sources(seeds, images)))]


def run_batch(llm, batch: list, params) -> None:
    if batch and isinstance(batch[0], list):  # chats
        llm.chat(batch, params, use_tqdm=False)
    else:
        llm.generate(batch, params, use_tqdm=False)


def engine(model: str, otlp_endpoint: str | None):
    """An in-process engine (the worker runs in the counted process) with a small KV cache."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    from mmscope.demo import environment

    environment.install()  # the tiny LLaVA's imports where torchvision does not load

    return LLM(model=model, enforce_eager=True, max_model_len=512, max_num_seqs=16,
               max_num_batched_tokens=256, limit_mm_per_prompt={"image": 1},
               kv_cache_memory_bytes=64 * 2**20, seed=0, disable_log_stats=False,
               otlp_traces_endpoint=otlp_endpoint)


def apply(instrumentor, name: str, trace_dir: str) -> None:
    """Enter a configuration through the same uninstrument-instrument round trip for each, the
    bare one too: it drops CPython's specialisations on the patched classes alike for every row."""
    from mmscope.emit import tracing

    instrumentor.instrument()
    instrumentor.uninstrument()
    tracing.configure("chrome" if name == EVERY_RANGE else "off", trace_dir)
    # Kept through the batches: the rows applied once media come by URL read it then.
    os.environ.pop("MMSCOPE_SKIP_HOOKS", None)
    if name.startswith(WITHOUT):
        os.environ["MMSCOPE_SKIP_HOOKS"] = name.removeprefix(WITHOUT)
    if name != BARE:
        instrumentor.instrument()


def hooks_at_work(instrumentor, llm, batch: list, params) -> list[str]:
    """--each-hook: the rows that may do something in this engine: of its worker's runner or of
    none, applied at start or once media come by URL, and still applied after a batch (a row that
    retires itself in-process costs nothing a step)."""
    from mmscope.vllm import runners
    from mmscope.vllm.patching import Status, When

    run_batch(llm, batch, params)
    runner = runners.runner_of(llm.llm_engine.model_executor.driver_worker.worker.model_runner)
    return [h.name for h in instrumentor.table if h.status is Status.APPLIED
            and h.when in (When.START, When.MEDIA) and runners.applies(h, runner)]


def fail(message: str) -> None:
    raise SystemExit(f"plugin_instructions: {message}")


def build_marker(out_dir: str) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        fail("no C compiler (cc or gcc) on PATH")
    lib = os.path.join(out_dir, "libcallgrind_mark.so")
    done = subprocess.run([cc, "-O2", "-shared", "-fPIC", str(ROOT / "bench" / "callgrind_mark.c"),
                           "-o", lib], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        fail("cannot build bench/callgrind_mark.c (is valgrind's callgrind.h installed? "
             f"apt-get install valgrind): {last}")
    return lib


def child(args) -> None:
    """Inside Valgrind: warm up, then every (answer length, pair, configuration) batch counted."""
    import ctypes

    from vllm import SamplingParams

    from mmscope.demo import tiny_model
    from mmscope.vllm.engine_core import handoff as engine_stats
    from mmscope.vllm.worker import step_telemetry
    from mmscope.vllm.instrumentor import get_instrumentor

    from mmscope.emit import chrome, tracing

    mark = ctypes.CDLL(args.marker)
    mark.mark_dump.argtypes = [ctypes.c_char_p]
    llm = engine(tiny_model.build(tiny_model.default_dir()), args.otlp_endpoint)
    engine_stats.SEND_EVERY_S = EMISSION_TIMER_S
    # The chrome writer's thread wakes every half second; a hundred times as often per batch under
    # Valgrind. Its work is counted instead by one flush at the end of each counted batch.
    chrome.FLUSH_INTERVAL_S = EMISSION_TIMER_S
    instrumentor = get_instrumentor()
    names = [BARE, TRACING_OFF] + ([] if args.no_chrome or args.each_hook else [EVERY_RANGE])
    batch_no = 0

    def next_batch() -> list:
        nonlocal batch_no
        batch_no += 1
        return workload_batch(batch_no, args.requests, args.images, args.media_url)

    with tempfile.TemporaryDirectory() as trace_dir:
        for n in args.max_tokens:
            params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
            apply(instrumentor, TRACING_OFF, trace_dir)
            # One full batch uncounted: the first one at a length allocates what later ones reuse.
            run_batch(llm, next_batch(), params)
            if args.each_hook:
                names = [BARE, TRACING_OFF] + [
                    WITHOUT + h for h in hooks_at_work(instrumentor, llm, next_batch(), params)]
            for pair in range(args.pairs):
                # Rotated each pair: no configuration always runs first or after the same one.
                for name in names[pair % len(names):] + names[:pair % len(names)]:
                    apply(instrumentor, name, trace_dir)
                    for _ in range(args.settle):
                        run_batch(llm, next_batch(), params)
                    batch = next_batch()
                    steps = step_telemetry._telemetry().step
                    gc.collect()
                    mark.mark_start()
                    run_batch(llm, batch, params)
                    tracing.flush()  # the batch's events formatted and written, counted
                    if args.otlp_endpoint:
                        from opentelemetry import trace
                        trace.get_tracer_provider().force_flush()  # its spans exported, counted
                    mark.mark_dump(f"{n}|{pair}|{name}".encode())
                    print(f"counted: {n} tokens, pair {pair + 1}/{args.pairs}, {name}, "
                          f"steps={step_telemetry._telemetry().step - steps}", file=sys.stderr, flush=True)
        apply(instrumentor, TRACING_OFF, trace_dir)


def run_child(args, out_dir: str) -> None:
    sys.path.insert(0, str(ROOT))
    with contextlib.ExitStack() as stack:
        media_url = None
        if "http" in args.images:
            media_url = stack.enter_context(media_server(args)).url
        otlp_endpoint = None
        if args.otlp:
            from tests.kit.otlp import Receiver

            receiver = stack.enter_context(Receiver())
            otlp_endpoint = receiver.endpoint
        count(args, out_dir, otlp_endpoint, media_url)
        if args.otlp:
            print(f"plugin_instructions: the receiver got {len(receiver.spans())} spans",
                  file=sys.stderr)


def media_server(args):
    """The loopback media server every http image of the run comes from, outside the counted
    process: its answers are no work of the engine's."""
    from mmscope.load.media_server import MediaServer

    server = MediaServer()
    for batch_no in range(1, batches_at_most(args) + 1):
        seeds = image_seeds(batch_no, args.requests)
        for seed, source in dict(zip(seeds, url_sources(seeds, args.images))).items():
            if source == "http":
                server.add(served_name(seed), png(seed), "image/png")
    return server


def count(args, out_dir: str, otlp_endpoint: str | None, media_url: str | None) -> None:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        fail("valgrind is not installed (Debian: apt-get install valgrind)")
    marker = build_marker(out_dir)
    cmd = [valgrind, "--tool=callgrind", "--instr-atstart=no",
           f"--callgrind-out-file={out_dir}/cg.out.%p", f"--log-file={out_dir}/valgrind.log",
           *(["--cache-sim=yes", LL_CACHE] if args.cache_sim else ["--cache-sim=no"]),
           sys.executable, os.path.abspath(__file__), "--child", "--marker", marker,
           "--pairs", str(args.pairs), "--requests", str(args.requests),
           "--settle", str(args.settle), "--runner", args.runner,
           "--max-tokens", ",".join(map(str, args.max_tokens)),
           "--images", ",".join(args.images)]
    cmd += ["--media-url", media_url] if media_url else []
    cmd += ["--no-chrome"] if args.no_chrome else []
    cmd += ["--each-hook"] if args.each_hook else []
    cmd += ["--otlp-endpoint", otlp_endpoint] if otlp_endpoint else []
    # Passive OpenMP threads sleep instead of spinning: a spin loop's instruction count depends
    # on timing, and Valgrind runs one thread at a time. vLLM's stats line (every 10 s of wall
    # time) is stretched as the plugin's timers are: else a batch would count as many lines as
    # Valgrind's slowdown and the machine's load make, not the one in ten seconds it writes.
    # VLLM_CPU_KVCACHE_SPACE as in the tests.
    # PYTHONPATH: vLLM inspects the model class in a subprocess, which needs the tiny LLaVA's
    # imports too (environment.install() covers only this process).
    from mmscope.demo import environment

    pythonpath = environment.pythonpath(os.environ.get("PYTHONPATH"))
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", PYTHONPATH=pythonpath,
               VLLM_LOG_STATS_INTERVAL=str(EMISSION_TIMER_S))
    env.update(runner_environment(args.runner, pythonpath))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    log_path = os.path.join(out_dir, "child.log")
    print(f"plugin_instructions: counting under Valgrind (log: {log_path})", file=sys.stderr)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.PIPE, text=True)
        for line in proc.stderr:
            log.write(line)
            if line.startswith("counted:"):
                print(line.rstrip(), file=sys.stderr)
                steps = re.search(r"^counted: (\d+) tokens.*steps=(\d+)$", line.strip())
                if steps and int(steps.group(2)):  # counted by mmscope's step hook: when on
                    STEPS[int(steps.group(1))] = int(steps.group(2))
        rc = proc.wait()
    if rc != 0:
        tail = Path(log_path).read_text(errors="replace").strip().splitlines()[-5:]
        fail(f"the engine under Valgrind exited with {rc}; last lines of {log_path}:\n  "
             + "\n  ".join(tail))


def runner_environment(runner: str, pythonpath: str) -> dict[str, str]:
    """What makes the engine under Valgrind run `runner` on the vLLM this Python has."""
    from tests.kit import runners, vllm034

    if vllm034.missing() is None:  # vLLM 0.34 (.venv-vllm034): V2 or its standalone CPU runner
        if runner not in vllm034.RUNNERS:
            fail(f"vLLM 0.34 has no --runner {runner}: choose {' or '.join(vllm034.RUNNERS)}")
        return vllm034.environment(runner, pythonpath)
    if runner not in (runners.V1, runners.V2):
        fail(f"--runner {runner} is vLLM 0.34's (run this script with .venv-vllm034/bin/python)")
    return runners.environment(runner, pythonpath)


def engine_label(runner: str) -> str:
    import vllm

    name = {"v1": "Model Runner V1", "v2": "Model Runner V2",
            "standalone": "Model Runner V2 (standalone CPU runner)"}[runner]
    return f"vLLM {vllm.__version__}, {name}"


STEPS: dict[int, int] = {}  # answer length -> engine steps a batch


def read_dumps(out_dir: str) -> dict[tuple[int, int, str], dict[str, int]]:
    """(answer length, pair, configuration) -> Callgrind's event totals for that batch."""
    counts = {}
    for path in sorted(Path(out_dir).glob("cg.out.*")):
        text = path.read_text(errors="replace")
        label = re.search(r"^desc: Trigger: Client Request: (.+)$", text, re.M)
        events = re.search(r"^events: (.+)$", text, re.M)
        # The totals line, not the summary: Callgrind 3.19 writes a summary that leaves out part
        # of the work in every dump after the first, while the totals add up the dump's cost
        # lines (what callgrind_annotate shows) and agree with the batches' run times.
        totals = re.search(r"^totals: (.+)$", text, re.M)
        if not (label and events and totals):
            continue  # the dump at exit, after the last batch
        n, pair, name = label.group(1).split("|", 2)
        counts[(int(n), int(pair), name)] = dict(zip(events.group(1).split(),
                                                     map(int, totals.group(1).split())))
    return counts


def cycles(events: dict[str, int]) -> int:
    return sum(events.get(k, 0) * w for k, w in CYCLE_WEIGHTS.items())


def images_label(images: tuple[str, ...]) -> str:
    if images == (PIL,):
        return "prompts given PIL images (LLM.generate)"
    return f"chats with images as {' and '.join(images)} URLs (LLM.chat)"


def report(counts, requests: int, where: str, runner: str, images: tuple[str, ...]) -> None:
    """Per answer length and configuration: the median batch, and each batch against the bare
    batch of its pair."""
    if not counts:
        fail(f"no batch counts (Callgrind dumps cg.out.*) in {where}")
    measures = [("instructions", lambda e: e["Ir"])]
    if all("D1mr" in e for e in counts.values()):
        measures.append(("cycle estimate (Ir + 10 x L1 misses + 100 x LL misses)", cycles))
    for n in sorted({m for m, _, _ in counts}):
        pairs = sorted({p for m, p, _ in counts if m == n})
        names = [BARE] + [name for name in dict.fromkeys(c for m, _, c in counts if m == n)
                          if name != BARE and not name.startswith(WITHOUT)]
        print(f"== {engine_label(runner)}: {n} tokens a request, {requests} single-image "
              f"{images_label(images)} a batch, {len(pairs)} batches per configuration")
        for what, measure in measures:
            print(f"{what}: per batch, and against the bare batch of the same pair")
            for name in names:
                both = [(measure(counts[(n, p, name)]), measure(counts[(n, p, BARE)]))
                        for p in pairs if (n, p, name) in counts and (n, p, BARE) in counts]
                if not both:
                    continue
                per = [x for x, _ in both]
                line = f"  {name:32} {statistics.median(per) / 1e6:10.1f} M"
                if name == BARE:
                    spread = (max(per) - min(per)) / statistics.median(per)
                    line += f"  (the bare batches within {spread * 100:.2f}% of each other)"
                else:
                    ratios = [x / b - 1 for x, b in both]
                    added = statistics.median(x - b for x, b in both)
                    line += (f"  {statistics.median(ratios) * 100:+6.2f}%  (pairs: "
                             + ", ".join(f"{r * 100:+.2f}%" for r in ratios)
                             + f")  {added / requests / 1e3:+.1f} K a request")
                    if STEPS.get(n):
                        line += f", {added / STEPS[n] / 1e3:+.1f} K a step ({STEPS[n]} steps)"
                print(line)
        each_hook(counts, n, pairs, requests)


def each_hook(counts, n: int, pairs: list[int], requests: int) -> None:
    """--each-hook: what each hook costs, as the whole plugin less the plugin without it."""
    rows = sorted({c.removeprefix(WITHOUT) for m, _, c in counts if m == n and c.startswith(WITHOUT)})
    if not rows:
        return
    print("what each hook costs (the plugin, tracing off, less the plugin without the hook), "
          "instructions:")
    found = []
    for hook in rows:
        added = [counts[(n, p, TRACING_OFF)]["Ir"] - counts[(n, p, WITHOUT + hook)]["Ir"]
                 for p in pairs if (n, p, WITHOUT + hook) in counts]
        bare = statistics.median(counts[(n, p, BARE)]["Ir"] for p in pairs)
        found.append((statistics.median(added), hook, bare))
    for added, hook, bare in sorted(found, reverse=True):
        line = f"  {hook:42} {added / 1e6:+7.2f} M  {added / bare * 100:+6.2f}%"
        line += f"  {added / requests / 1e3:+7.1f} K a request"
        if STEPS.get(n):
            line += f", {added / STEPS[n] / 1e3:+7.1f} K a step"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3,
                    help="counted batches per configuration and answer length (default 3)")
    ap.add_argument("--max-tokens", type=answer_lengths, default=[16, 128],
                    help="answer lengths, comma-separated (default 16,128)")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--images", type=image_sources, default=URL_SOURCES,
                    help="how the chats' images come: URL sources taken by turns (default "
                         "data_url,http: inline, and from a media server on loopback), or pil: "
                         "the offline batch given PIL images (LLM.generate)")
    ap.add_argument("--media-url", help=argparse.SUPPRESS)
    ap.add_argument("--runner", choices=("v1", "v2", "standalone"), default=None,
                    help="vLLM's model runner (default v1, vLLM CPU 0.32's own; standalone under "
                         "vLLM 0.34)")
    ap.add_argument("--cache-sim", action="store_true",
                    help="also simulate the caches and report the cycle estimate (about 2x slower)")
    ap.add_argument("--no-chrome", action="store_true", help="leave out every range on (chrome)")
    ap.add_argument("--each-hook", action="store_true",
                    help="also count the plugin without each of its hooks at work in turn (one "
                         "batch each): what each hook costs; implies --no-chrome")
    ap.add_argument("--otlp", action="store_true",
                    help="the engine traces requests to an OTLP receiver on loopback (vLLM's "
                         "--otlp-traces-endpoint): every configuration pays vLLM's tracing")
    ap.add_argument("--otlp-endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--settle", type=non_negative, default=0,
                    help="uncounted batches after each switch of configuration (default 0: every "
                         "counted batch, bare or not, follows a switch, so each pays the same "
                         "re-specialisation; 2 counts the steady state, as in a server)")
    ap.add_argument("--keep", metavar="DIR",
                    help="keep Callgrind's dumps here (one per batch: callgrind_annotate reads them)")
    ap.add_argument("--report", metavar="DIR",
                    help="count nothing: report the dumps an earlier --keep run left in DIR "
                         "(with the --requests it ran)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--marker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pairs < 1 or args.requests < 1:
        fail("--pairs and --requests must be positive")
    if args.runner is None:
        sys.path.insert(0, str(ROOT))
        from tests.kit import vllm034
        args.runner = "standalone" if vllm034.missing() is None else "v1"
    if args.child:
        return child(args)
    if args.report:
        return report(read_dumps(args.report), args.requests, args.report, args.runner, args.images)
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        if any(Path(args.keep).glob("cg.out.*")):
            fail(f"{args.keep} already holds Callgrind dumps; name an empty folder")
        out_dir = args.keep
        run_child(args, out_dir)
        return report(read_dumps(out_dir), args.requests, out_dir, args.runner, args.images)
    with tempfile.TemporaryDirectory(prefix="mmscope-callgrind-") as out_dir:
        run_child(args, out_dir)
        report(read_dumps(out_dir), args.requests, out_dir, args.runner, args.images)


if __name__ == "__main__":
    main()
