"""Carry mmscope's counts inside vLLM's SchedulerStats from EngineCore to the API server.

msgspec encodes only declared dataclass fields, so we declare one; it must exist in both processes
before process 0 builds its typed decoder (register() runs early enough).
"""
from __future__ import annotations

import dataclasses

FIELD = "encoder_cache_stats"


def inject_scheduler_stats_field() -> bool:
    """Add `encoder_cache_stats: dict[str, int] | None = None` (init=False) to SchedulerStats."""
    from vllm.v1.metrics.stats import SchedulerStats

    if FIELD in SchedulerStats.__dataclass_fields__:
        return True
    f = dataclasses.field(default=None, init=False)
    f.name = FIELD
    f.type = dict[str, int] | None
    f._field_type = dataclasses._FIELD  # private, but the only way to declare a field afterwards
    SchedulerStats.__dataclass_fields__[FIELD] = f
    SchedulerStats.__annotations__[FIELD] = f.type
    setattr(SchedulerStats, FIELD, None)
    return True


def has_field() -> bool:
    from vllm.v1.metrics.stats import SchedulerStats

    return FIELD in SchedulerStats.__dataclass_fields__
