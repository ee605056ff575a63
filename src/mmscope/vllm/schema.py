"""Carry mmscope's counts inside vLLM's SchedulerStats from EngineCore to the API server.

msgspec encodes only declared dataclass fields, so we declare one; it must exist in both processes
before process 0 builds its typed decoder (register() runs early enough).
"""
from __future__ import annotations

import dataclasses

# The hot paths read and write them as plain attributes (stats.encoder_cache_stats): a getattr
# by name costs more on every step.
FIELD = "encoder_cache_stats"  # EncoderCacheStats.to_wire()
STAGES_FIELD = "mm_stage_durations"  # worker stage -> durations in ns since the last stats
FIELDS = {FIELD: dict[str, int] | None, STAGES_FIELD: dict[str, list[int]] | None}


def inject_scheduler_stats_fields() -> None:
    """Declare our fields (default None, init=False) on SchedulerStats, once per process."""
    from vllm.v1.metrics.stats import SchedulerStats

    for name, type_ in FIELDS.items():
        if name in SchedulerStats.__dataclass_fields__:
            continue
        f = dataclasses.field(default=None, init=False)
        f.name, f.type = name, type_
        f._field_type = dataclasses._FIELD  # private, but the only way to add a field afterwards
        SchedulerStats.__dataclass_fields__[name] = f
        SchedulerStats.__annotations__[name] = type_
        setattr(SchedulerStats, name, None)
