"""`mmscope doctor`: every hook checked against the installed vLLM, without starting an engine,
and the releases mmscope is tested on or checked against (their sources, read from their wheels).

Exit status 1 when a required hook's target is missing in the installed vLLM or has another
signature; a release checked against its sources reports its result without changing the status.
"""
from __future__ import annotations

import argparse

from mmscope.vllm import release_check


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _entry_point_registered() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value == "mmscope.vllm.plugin:register"
               for ep in entry_points(group="vllm.general_plugins"))


def report() -> dict:
    from mmscope.demo import environment

    from mmscope.errors import UserError

    try:
        from mmscope.vllm.instrumentor import VllmInstrumentor
        instrumentor = VllmInstrumentor()
        version = instrumentor.vllm_version()
    except ImportError as e:
        raise UserError(f"vLLM is not importable here ({e}); install mmscope[vllm]") from None
    hooks = []
    for hook in instrumentor.hooks:
        ok, detail = hook.check()
        hooks.append({"name": hook.name, "target": hook.path, "feature": hook.feature,
                      "process": hook.process, "required": hook.required,
                      "status": "ok" if ok else hook.status, "detail": detail})
    return {"vllm_version": version, "supported": instrumentor.supported,
            "version_supported": instrumentor.version_supported(),
            "standing": release_check.standing(version),
            "entry_point": _entry_point_registered(), "hooks": hooks,
            "releases": release_check.releases_report(),
            "torchvision": environment.torchvision_status()}


def run(args) -> int:
    data = report()
    failed = [h for h in data["hooks"] if h["required"] and h["status"] != "ok"]
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
                    f"{', '.join(release_check.TESTED)})")
    console.print(f"vLLM {data['vllm_version']}: {support}")
    console.print("entry point vllm.general_plugins -> mmscope: "
                  + ("registered" if data["entry_point"] else "[red]missing[/red] (reinstall mmscope)"))
    table = Table("hook", "feature", "process", "target", "status")
    for column in table.columns:
        column.overflow = "fold"  # never cut a target name: it is what the user will look up
    for h in data["hooks"]:
        status = "[green]ok[/green]" if h["status"] == "ok" else f"[red]{h['status']}[/red] {h['detail']}"
        table.add_row(h["name"], h["feature"], h["process"], h["target"].split(":")[-1], status)
    console.print(table)
    console.print(f"{len(data['hooks']) - len(failed)}/{len(data['hooks'])} hooks ok")
    console.print(_releases_table(data["releases"]))
    console.print(data["torchvision"], highlight=False)
    return 1 if failed or not data["entry_point"] else 0


def _releases_table(releases: list[dict]):
    from rich.table import Table

    table = Table("vLLM release", "how", "result", title="releases")
    for column in table.columns:
        column.overflow = "fold"  # the fetch command is copied from here
    colour = {"ok": "green", "failed": "red", "not checked": "yellow"}
    for r in releases:
        status = r.get("status")
        result = r["detail"] if status is None else (
            f"[{colour[status]}]{status}[/{colour[status]}]: {r['detail']}")
        table.add_row(r["version"], r["how"], result)
    return table
