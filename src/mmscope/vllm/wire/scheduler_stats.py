"""What rides from EngineCore to the API server: five fields mmscope declares on vLLM's
SchedulerStats, which vLLM sends with every step's outputs (docs/design.md §4, Transport).

msgspec encodes only declared dataclass fields, so both processes declare them before process 0
builds its typed decoder (register() runs early enough).
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Carried:
    """The declaration of mmscope's fields, each None when nothing of its kind is due."""

    # the encoder cache's counts since the last stats (carry/ledger.py, EncoderCacheStats.to_wire)
    encoder_cache_stats: dict[str, int] | None = dataclasses.field(default=None, init=False)
    # worker stage -> its durations in ns since the last stats
    mm_stage_durations: dict[str, list[int]] | None = dataclasses.field(default=None, init=False)
    # request id -> its record once past its first token: encoder ns, EC-load ns, items computed
    # (carry/ttft_split.py), and while vLLM traces requests its items and outcomes
    # (carry/request_facts.py)
    mm_request_shares: dict[str, dict[str, int]] | None = dataclasses.field(default=None,
                                                                            init=False)
    # the EC connector's transfers since the last stats (carry/transfers.py)
    mm_ec_transfers: dict[str, int] | None = dataclasses.field(default=None, init=False)
    # hooks of EngineCore's process (and its workers') turned off since the last stats: name -> why
    mm_hooks_off: dict[str, str] | None = dataclasses.field(default=None, init=False)


def declare_fields() -> None:
    """Declare Carried's fields (default None) on vLLM's SchedulerStats, once per process.

    Why this way: SchedulerStats is a plain dataclass with no extension field (its
    `kv_connector_stats`/`ec_connector_stats` dicts are read by vLLM's own connector loggers),
    msgspec decodes only declared fields, and dataclasses has no API to add a field to an existing
    class. So each field, made by dataclasses itself on Carried, is registered under
    SchedulerStats.__dataclass_fields__, the mapping msgspec and dataclasses.fields() read.
    """
    from vllm.v1.metrics.stats import SchedulerStats

    for f in dataclasses.fields(Carried):
        if f.name not in SchedulerStats.__dataclass_fields__:
            SchedulerStats.__dataclass_fields__[f.name] = f
            SchedulerStats.__annotations__[f.name] = f.type
            setattr(SchedulerStats, f.name, None)
