"""How mmscope wraps vLLM (the mechanics), kept apart from what each wrapper observes.

A `Hook` names one target attribute and one wrapt wrapper; it checks the target, wraps it once and
unwraps it; the first exception of mmscope's own code in it unwraps it for good, with one warning.
Methods that differ by class (the model's, the EC connector's) are wrapped on their instances.
"""
from __future__ import annotations

import importlib
import inspect
import weakref
from dataclasses import dataclass, field
from typing import Callable

import wrapt

from mmscope.log import logger

APPLIED, MISSING, MISMATCH, OFF, NOT_APPLIED = (
    "applied", "missing", "signature mismatch", "off", "not applied")

# name -> Hook, for failed(): a wrapper names its hook only when its own code raised.
_hooks: dict[str, "Hook"] = {}


@dataclass
class Hook:
    """One wrapped attribute of vLLM. `path` is "module:Class.attr"; `params` the leading
    parameter names the wrapper reads (checked before wrapping); `wrapper` a wrapt wrapper,
    `wrapper(wrapped, instance, args, kwargs)`; `runner` the model runner whose code it wraps
    ("v1", "v2"), None for every other component."""

    name: str
    path: str
    params: tuple[str, ...]
    wrapper: Callable
    feature: str
    process: str
    required: bool = True
    runner: str | None = None
    status: str = field(default=NOT_APPLIED, init=False)
    detail: str = field(default="", init=False)

    def resolve(self) -> tuple[object, str, object]:
        """(owner, attribute, raw attribute as stored: a classmethod stays one)."""
        module_name, _, qual = self.path.partition(":")
        owner_path, _, attr = qual.rpartition(".")
        owner = importlib.import_module(module_name)
        for part in filter(None, owner_path.split(".")):
            owner = getattr(owner, part)
        return owner, attr, inspect.getattr_static(owner, attr)

    def check(self) -> tuple[bool, str]:
        """(ok, detail) without wrapping anything: the target exists with the expected signature."""
        try:
            _, _, raw = self.resolve()
        except (ImportError, AttributeError) as e:
            self.status, self.detail = MISSING, f"{type(e).__name__}: {e}"
            return False, self.detail
        raw = getattr(raw, "__wrapped__", raw) if isinstance(raw, wrapt.ObjectProxy) else raw
        func = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
        try:
            names = tuple(inspect.signature(func).parameters)
        except (TypeError, ValueError):
            names = ()
        if names[: len(self.params)] != self.params:
            self.status = MISMATCH
            self.detail = f"expected ({', '.join(self.params)}, ...), found ({', '.join(names)})"
            return False, self.detail
        return True, ""

    def apply(self) -> str:
        ok, detail = self.check()
        if not ok:
            (logger.warning if self.required else logger.info)(
                "mmscope: cannot hook %s (%s): %s; the rest keeps working",
                self.name, self.path, detail)
            return self.status
        if self.status != APPLIED:  # applied once per process however often instrument() runs
            owner, attr, _ = self.resolve()
            wrapt.wrap_function_wrapper(owner, attr, self.wrapper)
        _hooks[self.name] = self
        self.status, self.detail = APPLIED, ""
        return self.status

    def revert(self, status: str = NOT_APPLIED) -> None:
        if self.status == APPLIED:
            owner, attr, raw = self.resolve()
            if isinstance(raw, wrapt.FunctionWrapper):
                setattr(owner, attr, raw.__wrapped__)
        self.status = status

    def describe(self) -> str:
        return self.status + (f": {self.detail}" if self.detail else "")


def retire(name: str, reason: str) -> None:
    """Hook `name` has nothing to do in this process: vLLM's original from the next call on,
    without a word (instrument() after uninstrument() applies it again)."""
    hook = _hooks.pop(name, None)
    if hook is not None:
        hook.revert(f"retired: {reason}")


def failed(name: str, exc: BaseException) -> None:
    """mmscope's own code raised inside hook `name`: unwrap it (vLLM's original from the next
    call on) and say so once. vLLM's own exceptions never come here: they pass through."""
    hook = _hooks.pop(name, None)
    if hook is None:
        return  # already off (another thread raised first)
    hook.revert(OFF)
    hook.detail = f"after error: {type(exc).__name__}: {exc}"
    logger.warning("mmscope: hook %s raised %s: %s; it is now off and vLLM continues without it",
                   name, type(exc).__name__, exc)


# --- methods wrapped on their instances, once those exist ---------------------------------------
# uninstrument() unwraps them and instrument() wraps them again.
_instance_wraps: list[tuple] = []  # (weak reference, attribute, wrapt wrapper)


def wrap_instance(obj, attr: str, wrapper) -> None:
    if isinstance(getattr(obj, attr, None), wrapt.FunctionWrapper):
        return
    wrapt.wrap_function_wrapper(obj, attr, wrapper)
    if not any(ref() is obj and a == attr for ref, a, *_ in _instance_wraps):
        _instance_wraps.append((weakref.ref(obj), attr, wrapper))


def unwrap_instances() -> None:
    for ref, attr, *_ in _instance_wraps:
        obj = ref()
        method = getattr(obj, attr, None) if obj is not None else None
        if isinstance(method, wrapt.FunctionWrapper):
            delattr(obj, attr)  # the instance attribute was ours: the class's method shows again


def rewrap_instances() -> None:
    _instance_wraps[:] = [w for w in _instance_wraps if w[0]() is not None]
    for ref, attr, wrapper in list(_instance_wraps):
        wrap_instance(ref(), attr, wrapper)
