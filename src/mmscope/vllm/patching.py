"""How mmscope wraps vLLM (the mechanics), kept apart from what each wrapper measures.

A `Hook` names one target attribute and one wrapper factory; applying checks, installs once, reverts.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable

logger = logging.getLogger("vllm.mmscope")

APPLIED, MISSING, MISMATCH, FAILED, OFF = "applied", "missing", "signature mismatch", "failed", "off"


class HookState:
    """Whether a hook's own code may run; the first exception inside it turns the hook off."""

    def __init__(self, name: str):
        self.name = name
        self.enabled = True
        self.error: str | None = None
        self.retired: str | None = None
        self._restore: Callable[[], None] | None = None

    def retire(self, reason: str) -> None:
        """The hook has nothing to do in this process: put vLLM's original back, so that it
        costs nothing from the next call on (an instrument() after an uninstrument() re-applies
        it, and it may retire again)."""
        self.retired = reason
        if self._restore is not None:
            self._restore()

    def failed(self, exc: BaseException) -> None:
        if self.enabled:
            self.enabled = False
            self.error = f"{type(exc).__name__}: {exc}"
            logger.warning("mmscope: hook %s raised %s; it is now off and vLLM continues "
                           "without it", self.name, self.error)


@dataclass
class Hook:
    """One wrapped attribute of vLLM. `path` is "module:Class.attr"; `params` the leading
    parameter names the wrapper relies on (checked before patching)."""

    name: str
    path: str
    params: tuple[str, ...]
    factory: Callable[[Callable, HookState], Callable]
    feature: str
    process: str
    required: bool = True
    state: HookState = field(init=False)
    status: str = field(default="not applied", init=False)
    detail: str = field(default="", init=False)
    _owner: object = field(default=None, init=False, repr=False)
    _original: object = field(default=None, init=False, repr=False)

    def __post_init__(self):
        self.state = HookState(self.name)

    # --- resolution and checks ----------------------------------------------------------------
    def resolve(self) -> tuple[object, str, object]:
        module_name, _, qual = self.path.partition(":")
        owner_path, _, attr = qual.rpartition(".")
        owner = importlib.import_module(module_name)
        for part in filter(None, owner_path.split(".")):
            owner = getattr(owner, part)
        raw = inspect.getattr_static(owner, attr)
        return owner, attr, raw

    def check(self) -> tuple[bool, str]:
        """(ok, detail) without patching anything: the target exists with the expected signature."""
        try:
            _, _, raw = self.resolve()
        except (ImportError, AttributeError) as e:
            self.status, self.detail = MISSING, f"{type(e).__name__}: {e}"
            return False, self.detail
        func = _function_of(raw)
        try:
            names = tuple(inspect.signature(func).parameters)
        except (TypeError, ValueError):
            names = ()
        if names[: len(self.params)] != self.params:
            self.status = MISMATCH
            self.detail = f"expected ({', '.join(self.params)}, ...), found ({', '.join(names)})"
            return False, self.detail
        return True, ""

    # --- install / revert ---------------------------------------------------------------------
    def apply(self) -> str:
        ok, detail = self.check()
        if not ok:
            level = logger.warning if self.required else logger.info
            level("mmscope: cannot hook %s (%s): %s; the rest keeps working",
                  self.name, self.path, detail)
            return self.status
        owner, attr, raw = self.resolve()
        if getattr(_function_of(raw), "__mmscope_hook__", None) == self.name:
            self.status = APPLIED  # already applied in this process (idempotent)
            return self.status
        wrapped = self.factory(_function_of(raw), self.state)
        wrapped.__mmscope_hook__ = self.name
        setattr(owner, attr, _rewrap_like(raw, wrapped))
        self._owner, self._original = owner, raw
        self.state.retired, self.state._restore = None, self._put_back
        self.status, self.detail = APPLIED, ""
        return self.status

    def _put_back(self) -> None:
        if self._owner is not None:
            setattr(self._owner, self.path.rpartition(".")[2], self._original)
            self._owner = self._original = None

    def revert(self) -> None:
        self._put_back()
        self.state._restore = None
        self.status = "not applied"

    def describe(self) -> str:
        if self.status == APPLIED and not self.state.enabled:
            return f"{OFF} after error: {self.state.error}"
        if self.status == APPLIED and self.state.retired:
            return f"retired: {self.state.retired}"
        return self.status + (f": {self.detail}" if self.detail else "")


def _function_of(raw):
    return raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw


def _rewrap_like(raw, func):
    if isinstance(raw, classmethod):
        return classmethod(func)
    if isinstance(raw, staticmethod):
        return staticmethod(func)
    return func


# MMSCOPE_PY_WRAPPERS=1: the Python versions of the C hot paths, e.g. to compare the two.
PY_ONLY = os.environ.get("MMSCOPE_PY_WRAPPERS", "0") not in ("", "0")
try:  # built by pip install (setup.py); optional: the Python wrappers below do the same
    from mmscope.vllm import _wrappers as _native
except ImportError:
    _native = None
if PY_ONLY:
    _native = None


# --- `when`: a guard that keeps the observer's Python call off quiet calls -------------------
# A tuple of clauses; the observer runs when any holds. The clauses only read what vLLM has just
# returned or set (or our own flags), so a call with nothing to observe costs no Python frame.
RESULT = -1  # a clause's source: the wrapped call's result; i >= 0: the i-th positional argument
Source = int | tuple[int, str]  # a positional index, or param(index, name)


def param(index: int, name: str) -> tuple[int, str]:
    """A clause's source for a parameter that callers may pass by keyword: the index-th
    positional argument, or the keyword argument `name`, or None where the call omits it."""
    return (index, name)


def _clause(source, attrs: tuple, want_any: bool, via: str | None) -> tuple:
    index, name = source if isinstance(source, tuple) else (source, None)
    return (index, attrs, want_any, via, name)


def any_set(source: Source, *attrs: str, via: str | None = None) -> tuple:
    """Some of source's attributes (of `source.via`'s, with via) is truthy (a missing one counts
    as false)."""
    return _clause(source, attrs, True, via)


def all_clear(source: Source, *attrs: str, via: str | None = None) -> tuple:
    """None of source's attributes (of `source.via`'s, with via) is truthy."""
    return _clause(source, attrs, False, via)


def truthy(source: Source) -> tuple:
    """Source itself is truthy (e.g. the result of a yes/no call whose no needs no observer)."""
    return _clause(source, (), True, None)


def falsy(source: Source) -> tuple:
    """Source itself is falsy."""
    return _clause(source, (), False, None)


def every(seconds: float) -> tuple:
    """At least `seconds` since this clause last held (the first call holds)."""
    return (float(seconds),)


def guard_passes(when: tuple, timers: list[float], result, args: tuple,
                 kwargs: dict | None = None) -> bool:
    """The Python twin of _wrappers.c's guard_passes (the fallback and the reference)."""
    for i, clause in enumerate(when):
        if len(clause) == 1:
            now = time.monotonic()
            if now - timers[i] >= clause[0]:
                timers[i] = now
                return True
            continue
        source, attrs, want_any, via, name = clause
        if source == RESULT:
            obj = result
        elif source < len(args):
            obj = args[source]
        elif name is not None:
            obj = (kwargs or {}).get(name)  # by keyword, or omitted: None, as a default would be
        else:
            return True  # an unusual call: the observer decides
        try:
            if via is not None:
                obj = getattr(obj, via, None)  # missing: so is each of its attributes
            truths = [bool(getattr(obj, a, None)) for a in attrs] if attrs else [bool(obj)]
        except Exception:  # noqa: BLE001 - cannot tell: the observer decides
            return True
        if (any(truths) if want_any else not any(truths)):
            return True
    return not when


def native_wrapper(original: Callable, observe: Callable, state: HookState,
                   mode: str, when: tuple = (), **extra) -> Callable | None:
    """The C wrapper (a mode of _wrappers.c: AFTER, BEFORE, TIMED, TIMED_BY_ITEM,
    RANGED_CM; `extra` carries their name, slow, switch, store, limit and not_items) where
    it is built, else None. It passes the caller's arguments through with vectorcall and binds
    like a function: a Python wrapper's frame costs microseconds in vLLM's step loop, where caches
    are cold after every forward."""
    if _native is None:
        return None
    wrapper = _native.Wrapper(original, observe, state, getattr(_native, mode), when, **extra)
    return functools.update_wrapper(wrapper, original)


def observe_after(observe: Callable, when: tuple = ()) -> Callable[[Callable, HookState], Callable]:
    """A wrapper factory: call the original, then `observe(result, *args, **kwargs)` safely
    (only when the `when` guard passes, if one is given). vLLM's own exceptions pass through
    untouched; ours turn the hook off."""

    def factory(original: Callable, state: HookState) -> Callable:
        native = native_wrapper(original, observe, state, "AFTER", when)
        if native is not None:
            return native
        timers = [float("-inf")] * len(when)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            result = original(*args, **kwargs)
            if state.enabled and (not when or guard_passes(when, timers, result, args, kwargs)):
                try:
                    observe(result, *args, **kwargs)
                except Exception as e:  # noqa: BLE001 - instrumentation must not take vLLM down
                    state.failed(e)
            return result
        return wrapper
    return factory


def observe_before(observe: Callable, when: tuple = ()) -> Callable[[Callable, HookState], Callable]:
    """A wrapper factory: `observe(*args, **kwargs)` safely (when the guard passes), then call
    the original."""

    def factory(original: Callable, state: HookState) -> Callable:
        native = native_wrapper(original, observe, state, "BEFORE", when)
        if native is not None:
            return native
        timers = [float("-inf")] * len(when)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if state.enabled and (not when or guard_passes(when, timers, None, args, kwargs)):
                try:
                    observe(*args, **kwargs)
                except Exception as e:  # noqa: BLE001
                    state.failed(e)
            return original(*args, **kwargs)
        return wrapper
    return factory


def observe_around(before: Callable, after: Callable) -> Callable[[Callable, HookState], Callable]:
    """`token = before(*args)`; original; `after(token, result, *args)` — both guarded. A None
    token opts this call out (nothing to observe: the original runs bare). Otherwise `after` runs
    even when the original raises (with result None), so per-call state is always reset."""

    def factory(original: Callable, state: HookState) -> Callable:
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if not state.enabled:
                return original(*args, **kwargs)
            try:
                token = before(*args, **kwargs)
            except Exception as e:  # noqa: BLE001
                state.failed(e)
                token = None
            if token is None:
                return original(*args, **kwargs)
            result = None
            try:
                result = original(*args, **kwargs)
                return result
            finally:
                if state.enabled:
                    try:
                        after(token, result, *args, **kwargs)
                    except Exception as e:  # noqa: BLE001
                        state.failed(e)
        return wrapper
    return factory
