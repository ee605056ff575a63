"""`mmscope doctor`: every hook checked against the installed vLLM, without starting an engine, the
model runner vLLM picks here and which hooks apply to it, and the releases mmscope is tested on
or checked against (their sources, read from their wheels), with the runners each has. With
`--url` or `--log`, a running server instead: the hooks turned off in it, each worker's runner.

Exit status 1 when a required hook's target is missing in the installed vLLM or has another
signature, or when a hook of the server turned itself off; a release checked against its sources
reports its result without changing the status.
"""
from __future__ import annotations

import argparse

from mmscope.doctor import release_check
from mmscope.vllm import releases


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--url", help="a running vLLM server (http://HOST:PORT): the hooks turned off "
                                 "in it, from its /metrics")
    p.add_argument("--timeout", type=_timeout, default=10.0, metavar="SECONDS",
                   help="how long --url waits for the server's answer (default: 10)")
    p.add_argument("--log", metavar="FILE", help="a vLLM server's log: the runner each worker "
                                                 "uses and the hooks turned off or not applied")


def _timeout(text: str) -> float:
    from mmscope.analyze.readers.scrape import timeout

    return timeout(text)


def _entry_point_registered() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value == "mmscope.vllm.plugin:register"
               for ep in entry_points(group="vllm.general_plugins"))


def report() -> dict:
    from mmscope.demo import environment

    from mmscope.errors import UserError

    try:
        from mmscope.vllm import instrumentor, runners, targets
        from mmscope.vllm.patching import Status, When, in_release
        version = instrumentor.vllm_version()
        runner, why = runners.expected(version)
    except ImportError as e:
        raise UserError(f"vLLM is not importable here ({e}); install mmscope[vllm]") from None
    hooks = []
    for hook in targets.TABLE:
        if in_release(hook, version):
            ok, detail = hook.check()
            status = "ok" if ok else hook.status
        else:
            status, detail = Status.NOT_IN_RELEASE, f"vLLM {version}; {hook.releases}"
        hooks.append({"name": hook.name, "target": hook.path, "feature": hook.feature,
                      "process": hook.process, "required": hook.required,
                      "runner": hook.runner, "releases": hook.releases,
                      "applies": runners.applies(hook, runner),
                      "while_tracing": hook.when is When.TRACING,
                      "with_otlp": hook.when is When.OTLP,
                      "with_media": hook.when is When.MEDIA,
                      "status": str(status), "detail": detail})
    return {"vllm_version": version, "supported": releases.SUPPORTED_VLLM,
            "version_supported": instrumentor.version_supported(version),
            "standing": releases.standing(version),
            "entry_point": _entry_point_registered(),
            "runner": {"expected": runner, "why": why}, "hooks": hooks,
            "releases": release_check.releases_report(),
            "torchvision": environment.torchvision_status()}


NOT_IN_RELEASE = "not in this release"


def _status(h: dict) -> str:
    if h["status"] == NOT_IN_RELEASE:
        return f"[dim]{NOT_IN_RELEASE}[/dim] ({h['releases']})"
    if h["status"] != "ok":
        return f"[red]{h['status']}[/red] {h['detail']}"
    if not h["applies"]:
        return "[yellow]present; not this runner[/yellow]"
    when = (" (while tracing)" if h["while_tracing"] else
            " (once media come by URL)" if h.get("with_media") else "")
    return "[green]ok[/green]" + (" (with --otlp-traces-endpoint)" if h["with_otlp"] else when)


def run(args) -> int:
    from mmscope.vllm.runners import SHORT, TITLE

    if args.url or args.log:
        return _run_live(args)
    data = report()
    failed = [h for h in data["hooks"]
              if h["required"] and h["status"] not in ("ok", NOT_IN_RELEASE)]
    if args.json:
        import json
        print(json.dumps(data, indent=2))
        return 1 if failed else 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    support = data["standing"]
    if support == "untested":
        where = "within" if data["version_supported"] else "outside"
        support += (f" ({where} the supported range {data['supported']}; tested: "
                    f"{', '.join(releases.TESTED)})")
    console.print(f"vLLM {data['vllm_version']}: {support}")
    console.print("entry point vllm.general_plugins -> mmscope: "
                  + ("registered" if data["entry_point"] else "[red]missing[/red] (reinstall mmscope)"))
    runner = TITLE[data["runner"]["expected"]]
    console.print(f"model runner here: {runner} ({data['runner']['why']})", highlight=False)
    table = Table("hook", "feature", "process", "runner", "target", "status")
    for column in table.columns:
        column.overflow = "fold"  # never cut a target name: it is what the user will look up
    for h in data["hooks"]:
        table.add_row(h["name"], h["feature"], h["process"],
                      SHORT[h["runner"]] if h["runner"] else "",
                      h["target"].split(":")[-1], _status(h))
    console.print(table)
    console.print(_summary(data["hooks"], runner), highlight=False)
    console.print(_releases_table(data["releases"]))
    console.print(data["torchvision"], highlight=False)
    return 1 if failed or not data["entry_point"] else 0


def _summary(hooks: list[dict], runner_label: str) -> str:
    """One line that counts the same hooks as the releases' check."""
    release = [h for h in hooks if h["status"] != NOT_IN_RELEASE]
    present = sum(h["status"] == "ok" for h in release)
    applying = [h for h in release if h["applies"]]
    ok = sum(h["status"] == "ok" for h in applying)
    line = (f"{present} of the {len(release)} hook targets of this release present in the "
            f"installed vLLM; {ok} of the {len(applying)} hooks that apply to {runner_label} ok")
    others = len(release) - len(applying)
    if others:
        line += f"; {others} are the other runner's, not used here"
    if len(hooks) > len(release):
        line += f"; {len(hooks) - len(release)} rows are for other releases"
    return line


def _releases_table(releases: list[dict]):
    from rich.table import Table

    table = Table("vLLM release", "runners", "how", "result", title="releases")
    for column in table.columns:
        column.overflow = "fold"  # the fetch command is copied from here
    colour = {"ok": "green", "failed": "red", "not checked": "yellow"}
    for r in releases:
        status = r.get("status")
        result = r["detail"] if status is None else (
            f"[{colour[status]}]{status}[/{colour[status]}]: {r['detail']}")
        table.add_row(r["version"], ", ".join(r["runners"]), r["how"], result)
    return table


def _run_live(args) -> int:
    from mmscope.doctor import live

    data = {"metrics": live.from_metrics(args.url, args.timeout) if args.url else None,
            "log": live.from_log(args.log) if args.log else None}
    off = [h for part in data.values() if part for h in part["hooks_off"]]
    if args.json:
        import json
        print(json.dumps(data, indent=2))
        return 1 if off else 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False)
    log = data["log"]
    if log:
        console.print(f"log {log['source']}: vLLM {log['vllm']['version']} {log['vllm']['standing']}"
                      if log["vllm"] else f"log {log['source']}")
        table = Table("process", "model runner", "class", "hooks", title="workers")
        for w in log["workers"]:
            table.add_row(w["process"], w["runner"], w["class"], w["hooks"])
        console.print(table if log["workers"] else "no worker named its runner (start-up lines "
                      "are logged at INFO)")
        for h in log["not_applied"]:
            console.print(f"[yellow]not applied[/yellow] {escape(h['hook'])} "
                          f"({escape(h['process'])}): {escape(h['detail'])}")
    metrics = data["metrics"]
    if metrics:
        console.print(f"metrics {metrics['source']}: "
                      + (f"{len(metrics['hooks_off'])} hook series off" if metrics["hooks_off"]
                         else "no hook turned off"))
    for h in off:
        where = f"engine {h['engine']}" if "engine" in h else h["process"]
        why = h.get("error") or f"feature {h['feature']}: its figures are withdrawn from /metrics"
        console.print(f"[red]off[/red] {escape(h['hook'])} ({escape(where)}): {escape(why)}")
    return 1 if off else 0
