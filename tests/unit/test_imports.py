"""The adapter's modules import one another without a circle (the table imports the wrappers, the
wrappers only the mechanics and the core), counting imports inside functions too."""
from __future__ import annotations

import ast
import pathlib

import mmscope.vllm

PACKAGE = "mmscope.vllm"


def imports(path: pathlib.Path) -> set[str]:
    """The modules of `mmscope.vllm` that a module imports anywhere in its body."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:
                found.update(f"{PACKAGE}.{a.name}" for a in node.names)
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(PACKAGE + "."))
    return found


def graph() -> dict[str, set[str]]:
    folder = pathlib.Path(mmscope.vllm.__file__).parent
    modules = {f"{PACKAGE}.{p.stem}": p for p in folder.glob("*.py") if p.stem != "__init__"}
    return {name: imports(path) & modules.keys() for name, path in modules.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_the_adapter_has_no_import_circle():
    edges = graph()
    assert len(edges) > 20 and edges[f"{PACKAGE}.targets"]  # the walk saw the package
    assert cycle(edges) is None, " -> ".join(cycle(edges))


def test_the_cycle_finder_finds_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
