"""The hooks turned off, as the API server learns of them (docs/design.md §9): its own, and those
of each engine's processes that rode in on SchedulerStats; what each one fed is withdrawn.

Told to the series (stat_loggers.py) and read by the stats line (stats_line.py).
"""
from __future__ import annotations

from mmscope.vllm import runners
from mmscope.vllm.patching import TURNED_OFF, in_release
from mmscope.vocabulary import Feature

# engine index -> {hook: why}; None: in this process, which every engine's figures pass through
OFF: dict[int | None, dict[str, str]] = {}
# hook -> (feature, process), of this release's rows (the target table's)
ROWS: dict[str, tuple[str, str]] = {}
# told of every hook newly off, with its engine: withdraw(hooks, engine_idx)
LISTENERS: list = []


def know_rows(table) -> tuple[tuple[str, str, str], ...]:
    """The rows of the installed release, as (hook, feature, process)."""
    ROWS.update({r.name: (r.feature, r.process) for r in table if in_release(r, table.version)})
    return tuple((name, *row) for name, row in ROWS.items())


def rows_that_apply(table) -> tuple[str, ...]:
    """The rows of the release that may apply here: not those of a runner no worker here uses."""
    here = runners.possible(table.version)
    return tuple(r.name for r in table if r.name in ROWS and (r.runner is None or r.runner in here))


def turned_off(off: dict[str, str], engine_idx: int | None) -> None:
    """Hooks turned off in an engine's processes (None: in this one)."""
    known = OFF.setdefault(engine_idx, {})
    new = {name: why for name, why in off.items() if name not in known}
    if not new:
        return
    known.update(new)
    for withdraw in list(LISTENERS):
        withdraw(new, engine_idx)


def feature_of(name: str) -> str:
    return ROWS.get(name, ("",))[0]


def accounting_off(engine_idx: int) -> tuple[str, str] | None:
    """(hook, why) of an accounting hook turned off for the engine, or None."""
    for idx in (engine_idx, None):
        for name, why in OFF.get(idx, {}).items():
            if feature_of(name) == Feature.ACCOUNTING:
                return name, why
    return None


def _local(hook) -> None:
    """A hook of this process turned itself off (patching.TURNED_OFF's listener)."""
    turned_off({hook.name: hook.detail}, None)


def listen() -> None:
    if _local not in TURNED_OFF.listeners:
        TURNED_OFF.listeners.append(_local)


def stop_listening() -> None:
    if _local in TURNED_OFF.listeners:
        TURNED_OFF.listeners.remove(_local)
