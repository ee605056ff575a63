"""What a running vLLM says of mmscope, for `mmscope doctor --url/--log`: the hooks turned off (its
/metrics page, `vllm:mmscope_hook_off`), and from its log the runner each worker uses.

Read only from what the server exposes or wrote: nothing is sent to it but a GET of /metrics.
"""
from __future__ import annotations

import re

from mmscope.errors import UserError
from mmscope.expose.metrics import HOOK_OFF

# vLLM prefixes a process' lines with "(EngineCore_DP0 pid=12)" and the like; mmscope's own lines
# (vllm/runners.py, vllm/patching.py, vllm/instrumentor.py) say the rest.
_PROCESS = r"(?:\((?P<process>[^)]*)\) )?"
WORKER = re.compile(_PROCESS + r".*mmscope: this worker runs (?P<runner>Model Runner V\d) "
                    r"\((?P<cls>[^)]*)\): (?P<hooks>.*?); (?:the|no) other runner")
HOOK_OFF_LINE = re.compile(_PROCESS + r".*mmscope: hook (?P<hook>\S+) raised (?P<error>.*); "
                           r"it is now off and vLLM continues without it")
CANNOT_HOOK = re.compile(_PROCESS + r".*mmscope: cannot hook (?P<hook>\S+) \((?P<target>[^)]*)\): "
                         r"(?P<detail>.*); the rest keeps working")
VERSION = re.compile(r"mmscope: vLLM (?P<version>\S+) is (?P<standing>.*?)(?:;|, not tested)")


def from_metrics(url: str, timeout_s: float = 10.0) -> dict:
    """The hooks turned off, by engine, as a server's /metrics page says."""
    from prometheus_client.parser import text_string_to_metric_families

    from mmscope.analyze.readers.scrape import fetch, printable
    from mmscope.load.client import base_url

    root = base_url(url)
    page = root if root.endswith("/metrics") else root + "/metrics"
    text = fetch(page, timeout_s)
    off, rows = [], 0
    try:
        for family in text_string_to_metric_families(text):
            if family.name != HOOK_OFF[0]:
                continue
            for sample in family.samples:
                rows += 1
                if sample.value > 0:
                    off.append({k: sample.labels.get(k, "") for k in
                                ("hook", "feature", "process", "engine", "model_name")})
    except ValueError as e:
        raise UserError(f"{page}: not a Prometheus /metrics page ({printable(str(e))})") from None
    if not rows:
        raise UserError(f"{page}: no {HOOK_OFF[0]} series (is mmscope installed in the server's "
                        "Python environment?)")
    return {"source": page, "hooks_off": off}


def from_log(path: str) -> dict:
    """Each worker's runner and hooks, the hooks turned off or not applied, from a server log."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    workers, off, missing, version = [], [], [], None
    for line in lines:
        if m := WORKER.search(line):
            workers.append({"process": m["process"] or "", "runner": m["runner"],
                            "class": m["cls"], "hooks": m["hooks"]})
        elif m := HOOK_OFF_LINE.search(line):
            off.append({"process": m["process"] or "", "hook": m["hook"], "error": m["error"]})
        elif m := CANNOT_HOOK.search(line):
            missing.append({"process": m["process"] or "", "hook": m["hook"],
                            "target": m["target"], "detail": m["detail"]})
        elif version is None and (m := VERSION.search(line)):
            version = {"version": m["version"], "standing": m["standing"]}
    if not (workers or off or missing):
        raise UserError(f"{path}: no line of mmscope's in it (a vLLM log with mmscope installed, "
                        "at INFO level, is needed)")
    return {"source": path, "workers": workers, "hooks_off": off, "not_applied": missing,
            "vllm": version}
