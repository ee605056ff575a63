"""The package's modules import one another without a circle, counting imports inside functions
too; the plugin vLLM loads in every process imports no tool; no folder holds over 15 modules."""
from __future__ import annotations

import ast
import pathlib

import mmscope

ROOT = pathlib.Path(mmscope.__file__).parent
PLUGIN = "mmscope.vllm.plugin"  # the entry point vLLM loads (pyproject.toml)
TOOLS = ("mmscope.analyze", "mmscope.cache_size", "mmscope.cli", "mmscope.demo",
         "mmscope.doctor", "mmscope.load", "mmscope.record")
MAX_MODULES = 15


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py") if "startup" not in p.parts}


def imports(path: pathlib.Path, known: set[str]) -> set[str]:
    """The modules of the package that a module imports anywhere in its body (a package's
    __init__ counts for `from package import module` only where the name is no module)."""
    found = set()
    package = module_name(path) if path.stem == "__init__" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) - {name} for name, path in found.items()}


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


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others, with the packages above each
    (importing a module runs its packages' __init__)."""
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        parts = node.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))] + sorted(edges.get(node, ()))
    return seen


def test_the_package_has_no_import_circle():
    edges = graph()
    assert len(edges) > 100 and edges["mmscope.vllm.targets"]  # the walk saw the package
    assert cycle(edges) is None, " -> ".join(cycle(edges))


def test_the_plugin_imports_no_tool():
    loaded = reachable(graph(), PLUGIN)
    assert "mmscope.vllm.targets" in loaded and "mmscope.expose.metrics" in loaded
    tools = sorted(m for m in loaded if m.startswith(TOOLS))
    assert not tools, f"{PLUGIN} reaches {tools}"


def test_no_folder_holds_more_than_15_modules():
    folders = {}
    for path in modules().values():
        if path.stem != "__init__":
            folders.setdefault(path.parent.relative_to(ROOT.parent), []).append(path.stem)
    crowded = {str(f): len(m) for f, m in folders.items() if len(m) > MAX_MODULES}
    assert not crowded, crowded


def test_every_module_imports():
    """Each module of the package imports by its name (a rename leaves no stale import)."""
    import importlib

    for name in sorted(modules()):
        importlib.import_module(name)


def test_the_cycle_finder_finds_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_the_walk_follows_imports_inside_functions_and_packages():
    edges = {"p.a": {"p.b"}, "p.b": set(), "p": set(), "p.c": {"q.d"}, "q": set(), "q.d": set()}
    assert reachable(edges, "p.a") == {"p.a", "p.b", "p"}
    assert reachable(edges, "p.c") == {"p.c", "p", "q", "q.d"}
