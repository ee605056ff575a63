"""A real Prometheus server on loopback for tests: it scrapes its targets every second and answers
PromQL through its HTTP API; `promtool check metrics` on an exposition page.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import httpx

from mmscope.demo.serve import free_port

JOB = "vllm"
INSTALL_HINT = "install the Debian package `prometheus` (scripts/setup.sh does where apt is there)"


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"`{name}` is not on PATH: {INSTALL_HINT}")
    return path


def config(targets: list[str]) -> str:
    listed = ", ".join(f"'{t}'" for t in targets)
    return (f"global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            f"scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n"
            f"      - targets: [{listed}]\n")


class Prometheus:
    """`prometheus` scraping `target` ("host:port", path /metrics; or a list of them) every
    second; its configuration, data and log in `workdir`."""

    def __init__(self, target: str | list[str], workdir: str):
        self.targets = [target] if isinstance(target, str) else list(target)
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> "Prometheus":
        conf = os.path.join(self.workdir, "prometheus.yml")
        with open(conf, "w") as f:
            f.write(config(self.targets))
        self._log = open(os.path.join(self.workdir, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            [binary("prometheus"), f"--config.file={conf}",
             f"--storage.tsdb.path={os.path.join(self.workdir, 'data')}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}; see "
                                   f"{self._log.name}")
            try:
                if httpx.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"prometheus not ready after {timeout_s:.0f} s; see {self._log.name}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def query(self, expr: str, at: float) -> list[dict]:
        """An instant query at unix time `at`: the result vector (or a scalar as one sample)."""
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr, "time": f"{at:.3f}"},
                      timeout=30)
        body = r.json()
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus rejected {expr!r}: {body.get('error', r.text)}")
        data = body["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def latest_scrape(self, series: str) -> float | None:
        """Timestamp of the newest stored sample of `series`, or None before the first scrape."""
        result = self.query(f"timestamp({series})", time.time())
        return max((float(s["value"][1]) for s in result), default=None)

    def wait_for_scrape_after(self, series: str, after: float, timeout_s: float = 60) -> float:
        """The timestamp of the first stored sample of `series` taken after unix time `after`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ts = self.latest_scrape(series)
            if ts is not None and ts > after:
                return ts
            time.sleep(0.2)
        raise AssertionError(f"Prometheus stored no sample of {series} after {after:.3f} within "
                             f"{timeout_s:.0f} s; see {self._log.name}")


def check_metrics(text: str) -> list[str]:
    """`promtool check metrics` on an exposition page: its complaint lines (empty when clean)."""
    done = subprocess.run([binary("promtool"), "check", "metrics"], input=text,
                          capture_output=True, text=True, timeout=60)
    return [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
