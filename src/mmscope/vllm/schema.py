"""Carry mmscope's counts inside vLLM's SchedulerStats from EngineCore to the API server.

msgspec encodes only declared dataclass fields, so we declare five; both processes declare them
before process 0 builds its typed decoder (register() runs early enough).
"""
from __future__ import annotations

import dataclasses

FIELD = "encoder_cache_stats"  # EncoderCacheStats.to_wire(): dict[str, int]
STAGES_FIELD = "mm_stage_durations"  # worker stage -> durations in ns since the last stats
# request id -> its record once past its first token: encoder ns, EC-load ns, items computed
# (carry/ttft.py), and while vLLM traces requests its items and outcomes (carry/request_facts.py)
SHARES_FIELD = "mm_request_shares"
# the EC connector's transfers: "<items|bytes|ns>:<load|save>" -> count since the last stats
TRANSFERS_FIELD = "mm_ec_transfers"
# hooks of EngineCore's process (and its workers') turned off since the last stats: name -> why
HOOKS_OFF_FIELD = "mm_hooks_off"
FIELDS = {FIELD: dict[str, int] | None, STAGES_FIELD: dict[str, list[int]] | None,
          SHARES_FIELD: dict[str, dict[str, int]] | None, TRANSFERS_FIELD: dict[str, int] | None,
          HOOKS_OFF_FIELD: dict[str, str] | None}


def inject_scheduler_stats_fields() -> None:
    """Declare our fields (default None) on vLLM's SchedulerStats, once per process.

    Why this way: SchedulerStats is a plain dataclass with no extension field (its
    `kv_connector_stats`/`ec_connector_stats` dicts are read by vLLM's own connector loggers),
    msgspec decodes only declared fields, and dataclasses has no API to add a field to an existing
    class. So each field is made by dataclasses itself, on a throwaway class, and registered under
    SchedulerStats.__dataclass_fields__, the mapping msgspec and dataclasses.fields() read.
    """
    from vllm.v1.metrics.stats import SchedulerStats

    missing = [(n, t) for n, t in FIELDS.items() if n not in SchedulerStats.__dataclass_fields__]
    if not missing:
        return
    made = dataclasses.make_dataclass(
        "MmscopeFields", [(n, t, dataclasses.field(default=None, init=False)) for n, t in missing])
    for name, type_ in missing:
        SchedulerStats.__dataclass_fields__[name] = made.__dataclass_fields__[name]
        SchedulerStats.__annotations__[name] = type_
        setattr(SchedulerStats, name, None)
