"""The README's marked command blocks, run as a user runs them, on this project's machine.

A block is marked by `<!-- readme-test: SECTION KIND -->` on the line above its fence. KIND is
`run` (runs to its end), `serve` (starts a server, which runs until the section's first `stopped`
block or its end, then gets Ctrl-C), `stopped` (runs once that server has stopped) or `ci` (what
.ci/run runs). The `# ` comment lines that end a block are the output it shows (`...` matches
anything). A section's blocks run in order in one shell's environment, which `export` changes.

As the README says: a hub model becomes the tiny LLaVA, with the environment
`mmscope tiny-model --env` prints; `/tmp/tiny-llava` a fresh folder; port 8000 a free one.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
HUB_MODELS = ("Qwen/Qwen2.5-VL-3B-Instruct", "llava-hf/llava-1.5-7b-hf")
TINY_DIR = "/tmp/tiny-llava"
PORT = "8000"
MARK = re.compile(r"<!-- readme-test: (\S+) (run|serve|stopped|ci) -->")
BLOCK_TIMEOUT_S = 600


@dataclass
class Block:
    section: str
    kind: str
    lang: str  # the fence's language: bash or python
    code: str
    shows: list[str]  # the output the README shows, one line each
    line: int  # of the fence in README.md

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.section} {self.kind})"


def blocks(text: str | None = None) -> list[Block]:
    lines = (README.read_text() if text is None else text).splitlines()
    found = []
    for i, line in enumerate(lines):
        mark = MARK.fullmatch(line.strip())
        if mark is None:
            continue
        fence = lines[i + 1]
        assert fence.startswith("```"), f"README.md:{i + 1}: a mark must stand above a fence"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        body = lines[i + 2:end]
        code_end = len(body)
        while code_end and body[code_end - 1].startswith("# "):
            code_end -= 1
        found.append(Block(mark[1], mark[2], fence[3:].strip(), "\n".join(body[:code_end]) + "\n",
                           [ln[2:] for ln in body[code_end:]], i + 2))
    return found


def shows(expected: list[str], output: str) -> bool:
    """Every shown line, in order, among the output's lines; `...` matches anything."""
    lines = iter(output.splitlines())
    for want in expected:
        pattern = re.compile(".*".join(re.escape(part) for part in want.split("...")))
        if not any(pattern.fullmatch(line.rstrip()) for line in lines):
            return False
    return True


class Section:
    """One section's blocks, run in order in `workdir`; use as a context manager (a server it
    started is stopped at the end)."""

    def __init__(self, name: str, model: str, workdir: Path, env: dict[str, str] | None = None):
        from mmscope.demo.serve import free_port

        self.name, self.model, self.workdir = name, model, Path(workdir)
        self.pending = [b for b in blocks() if b.section == name]
        assert self.pending, f"no block of section {name!r} in README.md"
        self.port = free_port()
        self.server = None
        self.outputs: list[tuple[Block, str]] = []
        self.env = self._new_shell(env or {})

    def _new_shell(self, extra: dict[str, str]) -> dict[str, str]:
        """A new user's shell with the project's environment active, none of the tests' own
        set-up (the stand-ins' PYTHONPATH, the KV-cache cap); for a hub model, the tiny
        model's environment as `mmscope tiny-model --env` gives it."""
        from mmscope.demo import environment

        env = dict(os.environ, **extra)
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and p != environment.STARTUP_DIR)
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        if any(hub in b.code for b in self.pending for hub in HUB_MODELS):
            env = self._bash(f'eval "$(mmscope tiny-model {self.model} --env)"\n', env)[1]
        return env

    def substitute(self, text: str) -> str:
        for hub in HUB_MODELS:
            text = text.replace(hub, self.model)
        text = text.replace(TINY_DIR, str(self.workdir / "tiny-llava"))
        return re.sub(rf"(--port |:){PORT}\b", rf"\g<1>{self.port}", text)

    # --- running ----------------------------------------------------------------------------
    def serve(self):
        """Runs the blocks before the section's server and starts it; it runs until `stopped`."""
        from mmscope.demo.serve import VllmServer

        while (block := self.pending.pop(0)).kind != "serve":
            self._run(block)
        command = ["bash", "-c", self.substitute(block.code)]
        self.server = VllmServer.from_command(command, self.model, self.port,
                                              str(self.workdir / "server.log"), self.env,
                                              str(self.workdir))
        return self.server.start()

    def run_rest(self, before_stop=None) -> list[tuple[Block, str]]:
        """The remaining blocks, the server stopped (Ctrl-C) before the first `stopped` one, right
        after `before_stop()` where given."""
        while self.pending:
            block = self.pending.pop(0)
            if block.kind == "stopped" and self.server is not None:
                if before_stop is not None:
                    before_stop()
                self.server.stop()
            self._run(block)
        return self.outputs

    def _run(self, block: Block) -> None:
        code = self.substitute(block.code)
        if block.lang == "python":
            script = self.workdir / f"readme_{block.line}.py"
            script.write_text(code)
            python = shutil.which("python", path=self.env["PATH"])
            done = subprocess.run([python, str(script)], env=self.env, cwd=self.workdir,
                                  capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
            _check(block, done)
            output = done.stdout
        else:
            assert block.lang == "bash", f"{block}: a runnable block is bash or python"
            output, self.env = self._bash(code, self.env, block)
        expected = [self.substitute(line) for line in block.shows]
        assert shows(expected, output), f"{block} shows\n" + "\n".join(expected) + \
            f"\nbut printed\n{output[-3000:]}"
        self.outputs.append((block, output))

    def _bash(self, code: str, env: dict[str, str], block: Block | None = None):
        """(stdout, the environment the block leaves) of a bash block run with `set -e`."""
        env_file = self.workdir / ".readme-env"
        script = f"set -euo pipefail\n{code}env -0 > '{env_file}'\n"
        done = subprocess.run(["bash", "-c", script], env=env, cwd=self.workdir,
                              capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        _check(block, done)
        after = dict(item.split("=", 1) for item in env_file.read_text().split("\0") if item)
        return done.stdout, after

    def __enter__(self) -> "Section":
        return self

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.stop()


def _check(block: Block | None, done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, (f"{block or 'the tiny model environment'} exited with "
                                  f"{done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
