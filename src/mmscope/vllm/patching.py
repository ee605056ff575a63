"""How mmscope wraps vLLM (the mechanics), kept apart from what each wrapper observes.

A `Hook` is one row of the target table: it checks its target, binds the arguments its wrapper
reads by the row's names, wraps once and unwraps; an error of mmscope's own turns it off, loudly.
"""
from __future__ import annotations

import enum
import functools
import importlib
import inspect
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Callable

import wrapt

from mmscope.flags import flag
from mmscope.log import logger


class Status(enum.StrEnum):
    NOT_APPLIED = "not applied"
    APPLIED = "applied"
    MISSING = "missing"
    MISMATCH = "signature mismatch"
    NOT_IN_RELEASE = "not in this release"
    SKIPPED = "skipped"  # left out by MMSCOPE_SKIP_HOOKS or its feature's switch
    RETIRED = "retired"  # nothing to do in this process
    OFF = "off"  # turned itself off after an error of mmscope's own


class When(enum.StrEnum):
    """When a row is applied in a process."""

    START = "at start"
    TRACING = "while mmscope traces"  # rows that only open ranges
    OTLP = "once vLLM traces requests"  # vLLM's output processor made with tracing on
    MEDIA = "once media come by URL"  # the first item loaded, or at start with the TTFT split on


# A wrapper's arguments: (hook, wrapped, instance, args, kwargs, *the row's params, bound by name).
# A param that is vLLM's **kwargs receives the call's keyword dict.
_KWARGS = -1
_KEYWORD_ONLY = -2


@dataclass(eq=False)
class Hook:
    """One wrapped attribute of vLLM. `path` is "module:Class.attr"; `params` the names of the
    target's parameters the wrapper receives, in that order, bound by name whatever their position
    (checked before wrapping); `runner` the model runner whose code it wraps ("v1", "v2"), None
    for every other component; `releases` the vLLM releases the target exists in (a PEP 440
    specifier, "" for every supported one)."""

    name: str
    path: str
    params: tuple[str, ...]
    wrapper: Callable
    feature: str
    process: str
    runner: str | None = None
    releases: str = ""
    when: When = When.START
    required: bool = True
    status: Status = field(default=Status.NOT_APPLIED, init=False)
    detail: str = field(default="", init=False)
    table: "Table | None" = field(default=None, init=False, repr=False)  # the registry it is in
    _binding: tuple = field(default=(), init=False, repr=False)

    def resolve(self) -> tuple[object, str, object]:
        """(owner, attribute, raw attribute as stored: a classmethod stays one)."""
        module_name, _, qual = self.path.partition(":")
        owner_path, _, attr = qual.rpartition(".")
        owner = importlib.import_module(module_name)
        for part in filter(None, owner_path.split(".")):
            owner = getattr(owner, part)
        return owner, attr, inspect.getattr_static(owner, attr)

    def check(self) -> tuple[bool, str]:
        """(ok, detail) without wrapping anything: the target exists and has the parameters."""
        try:
            owner, _, raw = self.resolve()
        except (ImportError, AttributeError) as e:
            self.status, self.detail = Status.MISSING, f"{type(e).__name__}: {e}"
            return False, self.detail
        try:
            self._binding = binding(raw, self.params, strip_first=inspect.isclass(owner))
        except ValueError as e:
            self.status, self.detail = Status.MISMATCH, str(e)
            return False, self.detail
        return True, ""

    def apply(self) -> Status:
        ok, detail = self.check()
        if not ok:
            (logger.warning if self.required else logger.info)(
                "mmscope: cannot hook %s (%s): %s; the rest keeps working",
                self.name, self.path, detail)
            return self.status
        if self.status is not Status.APPLIED:  # once per process however often instrument() runs
            owner, attr, _ = self.resolve()
            wrapt.wrap_function_wrapper(owner, attr, bound(self, self.wrapper, self._binding))
        self.status, self.detail = Status.APPLIED, ""
        return self.status

    def revert(self, status: Status = Status.NOT_APPLIED, detail: str = "") -> None:
        if self.status is Status.APPLIED:
            owner, attr, raw = self.resolve()
            if isinstance(raw, wrapt.FunctionWrapper):
                setattr(owner, attr, raw.__wrapped__)
        self.status, self.detail = status, detail

    def describe(self) -> str:
        return self.status + (f": {self.detail}" if self.detail else "")

    def retire(self, reason: str) -> None:
        """Nothing to do in this process: vLLM's original from the next call on, without a word
        (instrument() after uninstrument() applies it again)."""
        with _lock:
            if self.status is Status.APPLIED:
                self.revert(Status.RETIRED, reason)

    def failed(self, exc: BaseException) -> None:
        """mmscope's own code raised inside this hook: unwrap it (vLLM's original from the next
        call on), say so once and keep it on record for the figures it fed (TURNED_OFF). vLLM's
        own exceptions never come here: wrappers call vLLM outside their guard."""
        with _lock:
            if self.status is not Status.APPLIED:
                return  # already off (another thread raised first)
            self.revert(Status.OFF, f"after error: {type(exc).__name__}: {exc}")
        TURNED_OFF.add(self)
        logger.warning("mmscope: hook %s raised %s: %s; it is now off and vLLM continues "
                       "without it", self.name, type(exc).__name__, exc)


_lock = threading.Lock()


def binding(raw, params: tuple[str, ...], strip_first: bool) -> tuple[tuple, ...]:
    """Where each of `params` is found in a call of `raw` (a function, classmethod, staticmethod
    or bound method): (position in wrapt's args, keyword name, default). wrapt passes a method's
    self (a classmethod's cls) as `instance`, so positions count from the next parameter.
    ValueError when a name is not a parameter of the target."""
    raw = raw.__wrapped__ if isinstance(raw, wrapt.ObjectProxy) else raw
    func = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
    first = 1 if strip_first and not isinstance(raw, staticmethod) else 0
    try:
        parameters = inspect.signature(func).parameters
    except (TypeError, ValueError):
        parameters = {}
    names = list(parameters)
    missing = [p for p in params if p not in parameters]
    if missing:
        raise ValueError(f"expected parameters ({', '.join(params)}), found ({', '.join(names)})")
    positional = [n for n, p in parameters.items()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    spec = []
    for name in params:
        p = parameters[name]
        default = None if p.default is p.empty else p.default
        if p.kind is p.VAR_KEYWORD:
            spec.append((_KWARGS, None, None))
        elif p.kind is p.KEYWORD_ONLY:
            spec.append((_KEYWORD_ONLY, name, default))
        else:
            keyword = None if p.kind is p.POSITIONAL_ONLY else name
            spec.append((positional.index(name) - first, keyword, default))
    return tuple(spec)


def bound(hook: Hook, wrapper, spec: tuple) -> Callable:
    """The wrapt wrapper that calls `wrapper(hook, wrapped, instance, args, kwargs, *params)`.

    It runs on every hooked call of vLLM's, so it is compiled once per row with one expression per
    param (as dataclasses and namedtuple compile their methods): a loop over the binding at each
    call would double the cost of the wrapt call itself."""
    if not spec:
        return functools.partial(wrapper, hook)
    namespace = {"wrapper": wrapper, "hook": hook}
    params = []
    for n, (index, keyword, default) in enumerate(spec):
        namespace[f"default{n}"] = default
        if index == _KWARGS:
            params.append("kwargs")
        elif index == _KEYWORD_ONLY:
            params.append(f"kwargs.get({keyword!r}, default{n})")
        else:
            params.append(f"(args[{index}] if n > {index} else kwargs.get({keyword!r}, default{n}))")
    exec("def call(wrapped, instance, args, kwargs):\n"
         "    n = len(args)\n"
         f"    return wrapper(hook, wrapped, instance, args, kwargs, {', '.join(params)})\n",
         namespace)
    return namespace["call"]


class Table:
    """The one registry of rows (vllm/targets.py makes it): which apply in this process, and how
    they stand. A row applies unless the installed vLLM is not among its releases,
    MMSCOPE_SKIP_HOOKS names it (by name prefix or feature), or its feature's switch is off."""

    def __init__(self, rows: list[Hook], switches: dict[str, str]):
        self.rows = rows
        self.switches = switches  # feature -> the environment switch that turns it on
        self.by_name = {row.name: row for row in rows}
        self.version: str | None = None  # the installed vLLM's, set by apply()
        for row in rows:
            row.table = self

    def __iter__(self):
        return iter(self.rows)

    def apply(self, when: When, version: str | None) -> None:
        self.version = version
        skipped = skipped_hooks()
        for row in self.rows:
            if row.when is not when:
                continue
            if not in_release(row, version):
                row.status, row.detail = Status.NOT_IN_RELEASE, f"vLLM {version}"
            elif row.name.startswith(skipped) or row.feature in skipped:
                row.status, row.detail = Status.SKIPPED, "MMSCOPE_SKIP_HOOKS"
            elif row.feature in self.switches and not flag(self.switches[row.feature]):
                row.status, row.detail = Status.SKIPPED, f"{self.switches[row.feature]}=1 turns it on"
            else:
                row.apply()

    def revert(self) -> None:
        for row in reversed(self.rows):
            row.revert()


def in_release(row: Hook, version: str | None) -> bool:
    """Whether the target exists in vLLM `version` (unknown: assumed)."""
    if not row.releases or version is None:
        return True
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return Version(version.split("+")[0]) in SpecifierSet(row.releases)


def skipped_hooks() -> tuple[str, ...]:
    """MMSCOPE_SKIP_HOOKS=name-prefix,feature,...: leave those hooks out (an escape hatch for
    production, and how the cost benchmark attributes instructions to each feature)."""
    raw = os.environ.get("MMSCOPE_SKIP_HOOKS", "")
    return tuple(p.strip() for p in raw.split(",") if p.strip())


class TurnedOff:
    """The hooks of this process that turned themselves off: name -> why, all of them, and those
    not yet sent on to where the API server reports them (vllm/engine_core/handoff.py)."""

    def __init__(self):
        self.all: dict[str, str] = {}
        self.unsent: dict[str, str] = {}
        self.listeners: list[Callable[[Hook], None]] = []  # told at once, in this process

    def add(self, hook: Hook) -> None:
        self.all[hook.name] = self.unsent[hook.name] = hook.detail
        for listener in list(self.listeners):
            try:
                listener(hook)
            except Exception as e:  # noqa: BLE001 - telling must not break the caller either
                logger.warning("mmscope: could not report hook %s as off: %s: %s", hook.name,
                               type(e).__name__, e)

    def merge(self, more: dict[str, str] | None) -> None:
        for name, why in (more or {}).items():
            if name not in self.all:
                self.all[name] = self.unsent[name] = why

    def drain(self) -> dict[str, str]:
        drained, self.unsent = self.unsent, {}
        return drained


TURNED_OFF = TurnedOff()


# --- methods wrapped on their instances, once those exist ---------------------------------------
# uninstrument() unwraps them and instrument() wraps them again.
_instance_wraps: list[tuple] = []  # (weak reference, attribute, wrapt wrapper)


def wrap_instance(obj, attr: str, wrapper, hook: Hook, params: tuple[str, ...] = ()) -> None:
    """`obj.attr` wrapped on the instance, its wrapper called as a row's is, for `hook`."""
    method = getattr(obj, attr, None)
    if isinstance(method, wrapt.FunctionWrapper):
        return
    call = bound(hook, wrapper, binding(method, params, strip_first=False))
    wrapt.wrap_function_wrapper(obj, attr, call)
    if not any(ref() is obj and a == attr for ref, a, *_ in _instance_wraps):
        _instance_wraps.append((weakref.ref(obj), attr, call))


def unwrap_instances() -> None:
    for ref, attr, *_ in _instance_wraps:
        obj = ref()
        method = getattr(obj, attr, None) if obj is not None else None
        if isinstance(method, wrapt.FunctionWrapper):
            delattr(obj, attr)  # the instance attribute was ours: the class's method shows again


def rewrap_instances() -> None:
    _instance_wraps[:] = [w for w in _instance_wraps if w[0]() is not None]
    for ref, attr, call in list(_instance_wraps):
        obj = ref()
        if not isinstance(getattr(obj, attr, None), wrapt.FunctionWrapper):
            wrapt.wrap_function_wrapper(obj, attr, call)
