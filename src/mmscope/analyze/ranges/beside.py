"""Work on the second core: a function run on its own thread while the caller's goes on. The
compiled passes and numpy's loops let go of Python's lock, so the two threads use both cores.
"""
from __future__ import annotations

import threading


class Beside:
    """`fn(*args)` started on a thread of its own; `result()` waits for it and gives its value
    (or raises its exception in the caller's thread)."""

    def __init__(self, fn, *args) -> None:
        self._value = self._error = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self._thread.start()

    def _run(self, fn, args) -> None:
        try:
            self._value = fn(*args)
        except BaseException as e:  # re-raised by result()
            self._error = e

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
