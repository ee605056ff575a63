"""GPU check of the worker's device-time seam (docs/design.md §3b): a chain of matrix products timed
as a stage by mmscope's stage timer on a CUDA device, beside CUDA events of the script's own and the
torch profiler's kernel time; the host time of the same call shows what a host clock would report.

Needs only torch with a CUDA device (no vLLM): `PYTHONPATH=src python3 bench/device_time_check.py`.
"""
from __future__ import annotations

import argparse
import sys
import time

STAGE = "gpu_model_runner: vit_forward"


def chain(a, b, length: int):
    x = a
    for _ in range(length):
        x = (x @ b) * 0.01  # scaled: the values stay finite whatever the length
    return x


def profiled_kernel_us(prof) -> float:
    return sum(e.self_device_time_total for e in prof.key_averages())


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from mmscope.emit.stage_timer import StageCollector, timed_stage

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--chain", type=int, default=50, help="matrix products in the stage")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("device_time_check: no CUDA device here", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    a = torch.randn(args.size, args.size, device=device, dtype=torch.bfloat16)
    b = torch.randn(args.size, args.size, device=device, dtype=torch.bfloat16)
    collector = StageCollector()
    collector.use_device_events(lambda: torch.Event(device=device, enable_timing=True))
    chain(a, b, 3)
    torch.cuda.synchronize()

    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}: "
          f"{args.chain} bf16 products of {args.size}x{args.size} per stage")
    print(f"{'rep':>3} {'host µs':>10} {'read early':>10} {'mmscope µs':>11} {'events µs':>10} "
          f"{'profiler µs':>12} {'mmscope/events':>15} {'mmscope/profiler':>17}")
    worst = 0.0
    for rep in range(args.reps):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            start.record()
            t0 = time.perf_counter_ns()
            with timed_stage(STAGE, collector):
                chain(a, b, args.chain)
            host_us = (time.perf_counter_ns() - t0) / 1e3
            end.record()
            early = len(collector.drain().get(STAGE, []))  # the kernels still run: nothing yet
            torch.cuda.synchronize()
        (recorded_ns,) = collector.drain()[STAGE]
        mmscope_us, events_us = recorded_ns / 1e3, start.elapsed_time(end) * 1e3
        kernels_us = profiled_kernel_us(prof)
        worst = max(worst, abs(mmscope_us / kernels_us - 1))
        print(f"{rep:>3} {host_us:>10.1f} {early:>10} {mmscope_us:>11.1f} {events_us:>10.1f} "
              f"{kernels_us:>12.1f} {mmscope_us / events_us:>15.3f} {mmscope_us / kernels_us:>17.3f}")
    print(f"largest gap between mmscope's sample and the profiler's kernel time: {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
