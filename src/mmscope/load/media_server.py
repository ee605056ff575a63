"""A media server on loopback for `mmscope load --media http`: it serves the workload's items by
URL, as the web servers clients link to do, each answer after a set latency (with its jitter),
and counts the fetches and bytes it served.

Standard library only (http.server on a thread of its own), so it runs wherever load runs.
"""
from __future__ import annotations

import http.server
import random
import threading
import time
from dataclasses import dataclass

PATH_PREFIX = "/media/"


@dataclass(frozen=True)
class Body:
    data: bytes
    content_type: str


class MediaServer:
    """Bodies by path under /media/; any other path is a 404. `latency_s` ± `jitter_s` (uniform,
    drawn from `seed`) before each answer; `served` and `bytes_served` count the answers."""

    def __init__(self, latency_s: float = 0.0, jitter_s: float = 0.0, seed: int = 0):
        self.latency_s, self.jitter_s = latency_s, jitter_s
        self._rng = random.Random(f"mmscope-media-server:{seed}")
        self._bodies: dict[str, Body] = {}
        self._lock = threading.Lock()
        self.served = 0
        self.bytes_served = 0
        self.answer_s: dict[str, float] = {}  # name -> its last answer's time, delay included
        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._http.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def add(self, name: str, data: bytes, content_type: str) -> str:
        """Serve `data` at /media/<name>; its URL."""
        self._bodies[name] = Body(data, content_type)
        return f"{self.url}{PATH_PREFIX}{name}"

    def forget(self, names) -> None:
        for name in names:
            self._bodies.pop(name, None)

    def delay(self) -> float:
        with self._lock:
            jitter = self._rng.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s else 0.0
        return max(0.0, self.latency_s + jitter)

    def counts(self) -> tuple[int, int]:
        """(answers with a body, their bytes) so far."""
        with self._lock:
            return self.served, self.bytes_served

    def _answered(self, name: str, body: Body, seconds: float) -> None:
        with self._lock:
            self.served += 1
            self.bytes_served += len(body.data)
            self.answer_s[name] = seconds

    def _handler(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                start = time.perf_counter()
                name = self.path[len(PATH_PREFIX):] if self.path.startswith(PATH_PREFIX) else ""
                body = server._bodies.get(name)
                time.sleep(server.delay())
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", body.content_type)
                self.send_header("Content-Length", str(len(body.data)))
                self.end_headers()
                try:
                    self.wfile.write(body.data)
                except (BrokenPipeError, ConnectionResetError):
                    return  # the server under test gave up on it: not served
                server._answered(name, body, time.perf_counter() - start)

            def log_message(self, *args):  # quiet: the load's output is its report
                pass

        return Handler

    def __enter__(self) -> "MediaServer":
        self._thread = threading.Thread(target=self._http.serve_forever, name="mmscope-media",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._http.shutdown()
        self._http.server_close()
