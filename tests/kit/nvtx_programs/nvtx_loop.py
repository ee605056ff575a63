"""Records `steps` closed ranges (optionally nested in one long outer range), writes a ready
file, then waits inside an open range until it is stopped: the record tests stop it with signals.

usage: nvtx_loop.py READY_FILE STEPS [--outer] [--threads N] [--forever]
"""
import os
import sys
import threading
import time

import nvtx


def steps(n: int) -> None:
    for i in range(n):
        with nvtx.annotate("step"):
            with nvtx.annotate("sub"):
                pass


def main() -> None:
    ready, n = sys.argv[1], int(sys.argv[2])
    threads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 1
    if "--outer" in sys.argv:
        nvtx.push_range("outer")
    workers = [threading.Thread(target=steps, args=(n,)) for _ in range(threads - 1)]
    for w in workers:
        w.start()
    steps(n)
    for w in workers:
        w.join()
    if "--outer" in sys.argv:
        nvtx.pop_range()
    if "--forever" not in sys.argv:
        return
    with nvtx.annotate("waiting"):
        with open(ready + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(ready + ".tmp", ready)
        while True:
            time.sleep(0.05)


if __name__ == "__main__":
    main()
