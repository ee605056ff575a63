"""Tiny-model throughput without mmscope, with mmscope (metrics on, tracing off) and with every
range on (chrome), measured side by side in one engine: mmscope's hooks are reverted and re-applied
between batches (uninstrument/instrument), so every configuration runs on the same process, cores
and memory, interleaved (DESIGN §8).

Run: .venv/bin/python bench/plugin_overhead.py [--rounds 12] [--requests 48] [--max-tokens 128,16]
     [--by-feature [FEATURE,...]] [--mechanics] [--aa] [--no-chrome] [--settle 2] [--runs N]
     [--raw FILE]
     .venv/bin/python bench/plugin_overhead.py --pool RAW_FILE [RAW_FILE ...]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


MECHANICS = "observers"  # as "feature left out": every hook applied, every observer switched off


def hook_features() -> tuple[str, ...]:
    """The hook table's `feature` values (importing the table does not import vLLM)."""
    from mmscope.vllm import targets

    return tuple(sorted({hook.feature for hook in targets.all_hooks()}))


FEATURES = hook_features()
TRACING_OFF, EVERY_RANGE, AA = ("mmscope, tracing off", "mmscope, every range (chrome)",
                                "without mmscope, again (A/A)")
TARGETS = {TRACING_OFF: 0.01, EVERY_RANGE: 0.03}  # DESIGN §8, against the bare engine
# The bare engine against itself must come out within this (its pooled 90% interval) for a pool
# to tell a 1% target: beyond it the machine is too noisy, whatever the mmscope rows say.
NOISE_GATE = 0.005
# How a configuration is entered (see apply()); runs entered differently do not pool.
ENTRY, OLD_ENTRY = "round trip", "switch only"


def configurations(by_feature: bool | list[str], mechanics: bool = False, aa: bool = False,
                   chrome: bool = True) -> dict[str, tuple[str | None, str]]:
    """name -> (feature left out, or None for all hooks / "all" for none; tracing spec).
    by_feature: True for every feature, or the features to leave out one at a time."""
    configs = {"without mmscope": ("all", "off"),
               TRACING_OFF: (None, "off")}
    if chrome:
        configs[EVERY_RANGE] = (None, "chrome")
    if mechanics:
        configs["hooks applied, observers off"] = (MECHANICS, "off")
    if aa:  # the bare engine against itself: how far a ratio moves with nothing to measure
        configs[AA] = ("all", "off")
    if by_feature:
        for feature in FEATURES if by_feature is True else by_feature:
            configs[f"tracing off, without {feature}"] = (feature, "off")
    return configs


def apply(instrumentor, left_out: str | None, spec: str, trace_dir: str) -> None:
    import vllm.v1.utils as vutils

    from mmscope.emit import tracing
    from mmscope.vllm import ranges

    # Every configuration is entered through the same patch-and-restore, the bare one too: it
    # invalidates CPython's specialisations on every patched class, and whatever of that the
    # settle batches leave falls on every row alike. (Restoring hooks that are not applied
    # changes nothing, so before this a bare batch after a bare one entered with warm
    # specialisations while mmscope's batches never did.)
    instrumentor.instrument()
    instrumentor.uninstrument()
    tracing.configure(spec, trace_dir)
    vutils._PROFILER_FUNC = None  # vLLM re-reads its choice; ours comes back with instrument()
    if left_out == "all":
        return
    instrumentor.instrument()
    for hook in instrumentor.hooks:
        # Switched off, a hook's wrapper still runs but calls no observer: what is left is the
        # cost of the wrappers themselves. (A hook whose own code failed stays off.)
        hook.state.enabled = left_out != MECHANICS and hook.state.error is None
        if hook.feature == left_out:
            hook.revert()
    ranges.route_vllm_ranges()


def workload_batch(batch_no: int, requests: int) -> list[dict]:
    """One batch of single-image requests. Half the images repeat earlier ones of the batch: hits
    and misses both exercised. Fresh images per batch, so each batch computes the same encoder
    work."""
    from tests.kit.engine import image, prompt

    base = 100_000 * batch_no
    return [prompt([image(base + (i // 2 if i % 2 else i))], f"Question {i}?")
            for i in range(requests)]


def settle(llm, params, batches: int, batch_no: int, requests: int) -> int:
    """Untimed batches after a switch of configuration, until CPython has re-specialised what the
    switch invalidated (see --settle); returns the last batch number used."""
    for _ in range(batches):
        batch_no += 1
        llm.generate(workload_batch(batch_no, requests), params, use_tqdm=False)
    return batch_no


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=at_least_two, default=12,
                    help="rounds a run (at least 2: the estimators need two batches each)")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--max-tokens", type=answer_lengths, default=[128, 16],
                    help="tokens generated per request; several (comma-separated) are timed side "
                         "by side, each against its own bare batches (default 128,16: the answer "
                         "length of vLLM's own multimodal benchmarks, and a prefill-heavy worst "
                         "case)")
    ap.add_argument("--by-feature", type=feature_list, nargs="?", const=True, default=False,
                    metavar="FEATURE,...",
                    help="also time mmscope with one feature's hooks left out, for every feature "
                         f"or for those named ({', '.join(FEATURES)})")
    ap.add_argument("--mechanics", action="store_true",
                    help="also time every hook applied with its observer switched off (what the "
                         "wrappers cost by themselves)")
    ap.add_argument("--aa", action="store_true",
                    help="also time the bare engine a second time: the A/A row is the noise floor")
    ap.add_argument("--no-chrome", action="store_true",
                    help="leave out every range on (chrome): more rounds a minute for the others")
    ap.add_argument("--settle", type=non_negative, default=2,
                    help="untimed batches after each switch of configuration (default 2). "
                         "Patching or restoring a class invalidates CPython's specialised "
                         "instructions on it, and code that runs once a step or once a request "
                         "takes about two batches to re-specialise; without them every mmscope "
                         "batch pays that, while in a server the hooks are applied once")
    ap.add_argument("--runs", type=int, default=1,
                    help="engine processes, one after another (each has its own memory layout, "
                         "which moves a ratio by more than its rounds' noise)")
    ap.add_argument("--raw", help="with --runs: also write every run's raw times to this JSON "
                                   "file (to pool them with another invocation's later)")
    ap.add_argument("--pool", nargs="+", metavar="RAW_FILE",
                    help="time nothing: pool the runs of earlier --raw files and report them")
    ap.add_argument("--json", help=argparse.SUPPRESS)  # a run's raw times, for the parent
    args = ap.parse_args()
    if args.pool:
        return report_runs(read_raw(args.pool), args)
    if args.runs > 1:
        return report_runs(several_runs(args), args)

    from vllm import SamplingParams

    from mmscope.demo import tiny_model
    from mmscope.vllm.instrumentor import get_instrumentor
    from tests.kit.engine import image, offline_llm, prompt

    llm = offline_llm(tiny_model.build(tiny_model.default_dir()), max_num_seqs=16)
    # Per answer length (as a string: the JSON key), per configuration: batch times.
    shapes = [str(n) for n in args.max_tokens]
    params = {n: SamplingParams(max_tokens=int(n), temperature=0.0, ignore_eos=True)
              for n in shapes}
    configs = configurations(args.by_feature, args.mechanics, args.aa, not args.no_chrome)
    instrumentor = get_instrumentor()
    times = {n: {name: [] for name in configs} for n in shapes}
    cpu = {n: {name: [] for name in configs} for n in shapes}
    tokens = dict.fromkeys(shapes, 0)
    with tempfile.TemporaryDirectory() as trace_dir:
        llm.generate([prompt([image(1)], "warm-up")] * 4, params[shapes[0]], use_tqdm=False)
        order = list(enumerate(configs.items()))
        batch_no = 0
        for r in range(args.rounds):
            for n in shapes:
                # A new order every time: no configuration always follows the same one.
                random.Random(batch_no).shuffle(order)
                for c, (name, (left_out, spec)) in order:
                    apply(instrumentor, left_out, spec, trace_dir)
                    batch_no = settle(llm, params[n], args.settle, batch_no, args.requests)
                    batch_no += 1
                    batch = workload_batch(batch_no, args.requests)
                    gc.collect()  # no collection debt carried from one configuration to the next
                    t, c = time.perf_counter(), time.process_time()
                    outs = llm.generate(batch, params[n], use_tqdm=False)
                    times[n][name].append(time.perf_counter() - t)
                    cpu[n][name].append(time.process_time() - c)
                    tokens[n] = sum(len(o.outputs[0].token_ids) for o in outs)
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
        apply(instrumentor, None, "off", trace_dir)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"times": times, "cpu": cpu, "tokens": tokens, "settle": args.settle,
                       "entry": ENTRY}, f)
        return
    for n in shapes:
        report(times[n], cpu[n], tokens[n], int(n), args)


def several_runs(args) -> list[dict]:
    """Each run in a fresh process; their raw times (also into --raw)."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.runs):
            out = os.path.join(tmp, f"run{k}.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--rounds", str(args.rounds),
                   "--requests", str(args.requests), "--settle", str(args.settle),
                   "--max-tokens", ",".join(str(n) for n in args.max_tokens),
                   "--json", out]
            if args.by_feature:
                cmd += ["--by-feature"] + ([] if args.by_feature is True
                                           else [",".join(args.by_feature)])
            cmd += ["--no-chrome"] if args.no_chrome else []
            cmd += ["--mechanics"] if args.mechanics else []
            cmd += ["--aa"] if args.aa else []
            print(f"run {k + 1}/{args.runs}", file=sys.stderr)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            with open(out) as f:
                runs.append(json.load(f))
    if args.raw:
        with open(args.raw, "w") as f:
            json.dump(runs, f)
    return runs


def read_raw(paths: list[str]) -> list[dict]:
    """The runs of several --raw files, which must have timed the same configurations."""
    runs = []
    for path in paths:
        try:
            with open(path) as f:
                runs += json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"plugin_overhead: cannot read {path}: {e}") from None
    try:  # per run: {"times": {answer length: {configuration: [s, ...]}}, "cpu": alike}
        layouts = {json.dumps({n: sorted(c) for n, c in r[clock].items()})
                   for r in runs for clock in ("times", "cpu")}
    except (KeyError, TypeError, AttributeError):
        layouts = set()
    if len(layouts) != 1:
        raise SystemExit("plugin_overhead: the files are not --raw files of this version, or they "
                         "timed different configurations or answer lengths")
    if len({r.get("settle", 0) for r in runs}) != 1:  # files from before --settle: 0
        raise SystemExit("plugin_overhead: the files timed with different --settle values")
    entries = sorted({r.get("entry", OLD_ENTRY) for r in runs})
    if len(entries) != 1:
        raise SystemExit("plugin_overhead: the files entered their configurations differently "
                         f"({' and '.join(entries)}): they do not pool")
    return runs


def report_runs(runs: list[dict], args) -> None:
    """Every run's figures, then all rounds pooled. The pooled interval resamples runs, then
    rounds within them, so it includes the run-to-run spread."""
    base = "without mmscope"
    rng = random.Random(0)
    for shape in runs[0]["times"]:
        names = list(runs[0]["times"][shape])
        batch_ms = [statistics.median(r["times"][shape][base]) * 1000 for r in runs]
        print(f"== {shape} tokens a request (bare batch, median per run: "
              f"{min(batch_ms):.0f}-{max(batch_ms):.0f} ms)")
        for clock, what in (("times", "wall time"), ("cpu", "CPU time of the process, all threads")):
            ratio = {n: [paired(r[clock][shape][n], r[clock][shape][base]) for r in runs]
                     for n in names}
            print(f"{what}: per run, median of per-round ratios to the bare run:")
            for n in names[1:]:
                medians = (statistics.median(x) * 100 for x in ratio[n])
                print(f"  {n:36} " + "  ".join(f"{m:+5.1f}%" for m in medians))
            rounds = sorted({len(r[clock][shape][base]) for r in runs})
            print(f"{what}: all {len(runs)} runs pooled ({len(runs)} x "
                  f"{'/'.join(map(str, rounds))} rounds, each a batch of {args.requests} image "
                  f"requests, {shape} tokens each):")
            intervals = {}
            for n in names[1:]:
                pooled = [v for x in ratio[n] for v in x]
                lo, hi = intervals[n] = pooled_interval(ratio[n], rng)
                print(f"  {n:36} {statistics.median(pooled) * 100:+5.1f}% [{lo * 100:+5.1f}, "
                      f"{hi * 100:+5.1f}] (90% interval, runs and rounds resampled)")
            if clock == "times":
                for line in verdicts(intervals):
                    print(line)
            print(f"{what}, fast tails: per run, the 10th percentile of the batch times against "
                  f"the bare run's; mean of the {len(runs)} runs:")
            for n in names[1:]:
                tails = [quantile(r[clock][shape][n], 0.10) / quantile(r[clock][shape][base], 0.10)
                         - 1 for r in runs]
                lo, hi = interval(tails, rng, statistic=statistics.mean)
                print(f"  {n:36} {statistics.mean(tails) * 100:+5.1f}% [{lo * 100:+5.1f}, "
                      f"{hi * 100:+5.1f}] (90% interval, runs resampled)")


def verdicts(intervals: dict[str, tuple[float, float]]) -> list[str]:
    """DESIGN §8's targets against the pooled wall-time intervals, gated by the A/A row: a pool
    whose bare engine moves against itself by more than NOISE_GATE tells nothing at 1%."""
    aa = intervals.get(AA)
    noisy = aa is not None and max(-aa[0], aa[1]) > NOISE_GATE
    lines = []
    for name, target in TARGETS.items():
        if name not in intervals:
            continue
        lo, hi = intervals[name]
        if aa is None:
            verdict = "unchecked: no A/A row (--aa), so the noise floor is unknown"
        elif noisy:
            verdict = (f"not resolved: the bare engine against itself spans [{aa[0] * 100:+.1f}, "
                       f"{aa[1] * 100:+.1f}], wider than +-{NOISE_GATE * 100:.1f}%: the machine "
                       "is too noisy for this pool")
        elif hi < target:
            verdict = f"within {target:.0%} (the whole 90% interval below it)"
        elif lo > target:
            verdict = f"over {target:.0%} (the whole 90% interval above it)"
        else:
            verdict = f"not resolved: the 90% interval spans {target:.0%} (more runs narrow it)"
        lines.append(f"  target {name}: {verdict}")
    return lines


def pooled_interval(runs: list[list[float]], rng: random.Random) -> tuple[float, float]:
    """The median's 90% interval, resampling runs, then rounds within them: it includes the
    run-to-run spread (each process has its own memory layout)."""
    meds = sorted(statistics.median([v for x in rng.choices(runs, k=len(runs))
                                     for v in rng.choices(x, k=len(x))])
                  for _ in range(1000))
    return meds[50], meds[949]


def paired(ts: list[float], base: list[float]) -> list[float]:
    """Per-round ratios to the bare run of the same round: slow drifts of the machine cancel."""
    return [t / b - 1 for t, b in zip(ts, base)]


def interval(ratios: list[float], rng: random.Random, n: int = 2000,
             statistic=statistics.median) -> tuple[float, float]:
    """A 90% bootstrap interval of the median ratio (or of another statistic, such as the mean of
    the runs' fast tails): how far the figure could move by chance."""
    stats = sorted(statistic(rng.choices(ratios, k=len(ratios))) for _ in range(n))
    return stats[int(0.05 * n)], stats[int(0.95 * n)]


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def at_least_two(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 2:
        raise argparse.ArgumentTypeError(f"not an int >= 2: {text!r}")
    return n


def non_negative(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"not a count (an int >= 0): {text!r}")
    return n


def feature_list(text: str) -> list[str]:
    """--by-feature's optional value: features of the hook table, comma-separated."""
    features = [x.strip() for x in text.split(",") if x.strip()]
    unknown = sorted(set(features) - set(FEATURES))
    if not features or unknown:
        raise argparse.ArgumentTypeError(f"not a feature: {', '.join(unknown) or repr(text)} "
                                         f"(features: {', '.join(FEATURES)})")
    return features


def answer_lengths(text: str) -> list[int]:
    """--max-tokens: one or more positive ints, comma-separated."""
    try:
        lengths = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ints: {text!r}") from None
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"token counts must be positive: {text!r}")
    return lengths


def report(times, cpu, tokens, max_tokens, args) -> None:
    """Two estimators. The median of per-round ratios, with its bootstrap interval; and the ratio
    of the fast tails (10th percentile of each configuration's batch times): other jobs on the
    machine only ever add time, so the fastest batches are the least disturbed ones."""
    rng = random.Random(0)
    base_t, base_c = times["without mmscope"], cpu["without mmscope"]
    base_p10 = quantile(base_t, 0.10)
    print(f"{'configuration':36} {'batch ms':>9} {'tokens/s':>9} {'images/s':>9} "
          f"{'wall vs bare [90% interval]':>29} {'CPU vs bare':>11} {'p10 vs bare':>11}")
    for name in times:
        t = statistics.median(times[name])
        ratios = paired(times[name], base_t)
        lo, hi = interval(ratios, rng)
        cpu_ratio = statistics.median(paired(cpu[name], base_c))
        p10 = quantile(times[name], 0.10) / base_p10 - 1
        print(f"{name:36} {t * 1000:9.1f} {tokens / t:9.0f} {args.requests / t:9.1f} "
              f"{statistics.median(ratios) * 100:+14.1f}% [{lo * 100:+5.1f}, {hi * 100:+5.1f}] "
              f"{cpu_ratio * 100:+10.1f}% {p10 * 100:+10.1f}%")
    print(f"(over {args.rounds} interleaved rounds, each a batch of {args.requests} image "
          f"requests, {max_tokens} tokens each, one in-process engine; wall: median of per-round ratios to "
          f"the bare run; CPU: the same for the process's CPU time, all threads; p10: ratio of "
          f"the 10th percentiles of batch times)")

if __name__ == "__main__":
    main()
