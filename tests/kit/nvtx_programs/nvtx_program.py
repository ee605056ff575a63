"""A program that makes real NVTX calls through the `nvtx` package, for the record tests.

It writes what it did, with CLOCK_MONOTONIC_RAW bounds around each range, as JSON to argv[1]
(children append their own JSON files next to it), so the test can check the recording exactly.
"""
import json
import os
import subprocess
import sys
import threading
import time

import nvtx


def now() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)


def timed(facts: dict, name: str, body) -> None:
    before = now()
    body()
    facts[name] = [before, now()]


def child(path: str) -> None:
    facts = {"pid": os.getpid(), "tid": threading.get_native_id()}
    timed(facts, "child-range", lambda: _annotated("child-range", 0.01))
    with open(path, "w") as f:
        json.dump(facts, f)


def _annotated(name: str, seconds: float, **kwargs) -> None:
    with nvtx.annotate(name, **kwargs):
        time.sleep(seconds)


def fork_child(path: str) -> None:
    """A fork child that ends with os._exit, as multiprocessing's fork children do."""
    pid = os.fork()
    if pid == 0:
        facts = {"pid": os.getpid(), "tid": threading.get_native_id()}
        timed(facts, "fork-child-range", lambda: _annotated("fork-child-range", 0.01))
        with open(path, "w") as f:
            json.dump(facts, f)
        os._exit(0)
    os.waitpid(pid, 0)


def main(out: str) -> None:
    facts = {"pid": os.getpid(), "tid": threading.get_native_id()}

    def outer():
        with nvtx.annotate("outer", color="red"):
            nvtx.push_range("inner")
            time.sleep(0.02)
            nvtx.pop_range()
            nvtx.mark("tick")

    timed(facts, "outer", outer)

    domain = nvtx.get_domain("mydomain")
    attrs = domain.get_event_attributes(message="in-domain", category="cat-a", payload=42)

    def in_domain():
        domain.push_range(attrs)
        time.sleep(0.005)
        domain.pop_range()

    timed(facts, "in-domain", in_domain)

    start_bound = now()
    rid = nvtx.start_range("cross-thread", domain="mydomain")

    def worker():
        facts["worker_tid"] = threading.get_native_id()
        timed(facts, "worker-range", lambda: _annotated("worker-range", 0.01))
        time.sleep(0.01)
        nvtx.end_range(rid)
        facts["cross-thread"] = [start_bound, now()]

    t = threading.Thread(target=worker)
    t.start()
    t.join()

    subprocess.run([sys.executable, __file__, "--child", out + ".child"], check=True)
    fork_child(out + ".fork")
    nvtx.push_range("never-closed")
    with open(out, "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main(sys.argv[1])
