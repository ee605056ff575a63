"""Starts THREADS short-lived threads one after another, each recording RANGES ranges named after
it: exited threads' rings are handed to new threads, whose records must not mix.

usage: nvtx_churn.py THREADS RANGES
"""
import sys
import threading

import nvtx


def work(i: int, n: int) -> None:
    for _ in range(n):
        with nvtx.annotate(f"t{i}"):
            pass


if __name__ == "__main__":
    for i in range(int(sys.argv[1])):
        t = threading.Thread(target=work, args=(i, int(sys.argv[2])))
        t.start()
        t.join()
