"""Each multimodal request's time to first token, split by part (docs/design.md §4a): EngineCore
shares its steps' encoder and EC-load time among requests; the API server joins them with vLLM's own.

Independent of vLLM: the adapter feeds it request ids, step figures and vLLM's request timestamps.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from mmscope import stages
from mmscope.flags import flag

# Opt-in, as vLLM's own per-request detail (--enable-mm-processor-stats): on the tiny model's
# worst case the split costs 0.4% of the instructions, seven histogram observations a request.
ENV = "MMSCOPE_TTFT_PARTS"

# Requests whose other half never comes (aborted before their first token) are dropped oldest first.
MAX_PENDING = 4096
# The shares of an engine record: encoder ns, EC-load ns, items computed. A record may hold more
# (carry/request_facts.py, while vLLM traces requests): a flat dict[str, int] on the wire.
ENCODER, EC_LOAD, COMPUTED = "encoder_ns", "ec_load_ns", "computed"
SHARES = (ENCODER, EC_LOAD, COMPUTED)


class EngineShares:
    """EngineCore: per multimodal request, its share of the encoder and EC-load time of the steps
    that computed or loaded its items, until its first token (then it is `done`, to be sent).
    `extra`: the further counts each new record starts with (none unless vLLM traces requests)."""

    def __init__(self):
        self.open: dict[str, dict[str, int]] = {}
        self.done: dict[str, dict[str, int]] = {}
        self.extra: dict[str, int] = {}

    def record(self, request_id: str) -> dict[str, int]:
        """The request's open record, made on first use."""
        record = self.open.get(request_id)
        if record is None:
            record = self.open[request_id] = dict.fromkeys(SHARES, 0) | self.extra
        return record

    def admit(self, request_id: str, counts: dict[str, int] | None = None) -> None:
        """The request is first scheduled; `counts` (its items) are set on its record."""
        record = self.record(request_id)
        if counts:
            record.update(counts)

    def share(self, slot: str, step_ns: int, weights: dict[str, int]) -> None:
        """A step's `step_ns` shared by embeddings (`weights`: request -> embeddings it computed
        or loaded); integer nanoseconds, the remainder to the largest share, so that the shares
        add up to the step exactly."""
        total = sum(weights.values())
        if not total or step_ns <= 0:
            return
        given = 0
        for request_id, w in weights.items():
            record = self.open.get(request_id)
            if record is not None:
                part = step_ns * w // total
                record[slot] += part
                given += part
        largest = max(weights, key=weights.get)
        if largest in self.open:
            self.open[largest][slot] += step_ns - given

    def computed(self, request_id: str, items: int) -> None:
        record = self.open.get(request_id)
        if record is not None:
            record[COMPUTED] += items

    def close(self, first_token_done) -> None:
        """Requests past their first token (or gone) move to `done`: their encoder work is over."""
        for request_id in [r for r in self.open if first_token_done(r)]:
            self.done[request_id] = self.open.pop(request_id)

    def drain(self) -> dict[str, dict[str, int]]:
        done, self.done = self.done, {}
        return done


class TtftSplit(NamedTuple):
    """One request's time to first token and its parts, in seconds; `hit`: the encoder ran for
    none of its items (hits, connector loads, prefix cache). NamedTuples: one per request."""

    request_id: str
    engine: int
    hit: bool
    ttft_s: float
    parts: dict[str, float]  # in stages.TTFT_PARTS order (the histograms zip them)
    internal_id: str  # vLLM's internal request id, as EngineCore knows the request


class FrontTimes(NamedTuple):
    """The API server's view at the request's end (vLLM's RequestStateStats): seconds."""

    external_id: str
    ttft_s: float
    queue_s: float
    prefill_s: float


def enabled() -> bool:
    """MMSCOPE_TTFT_PARTS=1: each multimodal request's TTFT is split (read as each process
    instruments and as each engine starts)."""
    return flag(ENV)


def bounded_put(table: OrderedDict, key, value) -> None:
    table[key] = value
    if len(table) > MAX_PENDING:
        table.popitem(last=False)


class ApiTimes(NamedTuple):
    """The API server's processing of one request (seconds): vLLM's arrival until it leaves for
    EngineCore, and the wall time of its items' media and of its multimodal processor in it."""

    api_s: float
    media_s: float = 0.0
    processor_s: float = 0.0


class TtftJoin:
    """The API server: joins, by internal request id, the API-processing time, vLLM's timestamps
    at the request's end and EngineCore's shares, whichever comes last; `ready` holds the splits."""

    def __init__(self):
        self.api: OrderedDict[str, ApiTimes] = OrderedDict()
        self.front: OrderedDict[str, FrontTimes] = OrderedDict()
        self.engine: OrderedDict[str, tuple[int, dict[str, int]]] = OrderedDict()
        self.ready: list[TtftSplit] = []

    def assigned(self, request_id: str, api: ApiTimes) -> None:
        bounded_put(self.api, request_id, api)

    def finished(self, request_id: str, front: FrontTimes) -> None:
        if request_id not in self.api:
            return  # not multimodal, or its start was not seen
        engine = self.engine.pop(request_id, None)
        if engine is None:
            bounded_put(self.front, request_id, front)
        else:
            self._join(request_id, front, *engine)

    def engine_shares(self, shares: dict[str, dict[str, int]], engine_idx: int) -> None:
        for request_id, record in shares.items():
            if request_id not in self.api:
                continue  # its start was not seen: a record sent for vLLM's request span only
            front = self.front.pop(request_id, None)
            if front is None:
                bounded_put(self.engine, request_id, (engine_idx, record))
            else:
                self._join(request_id, front, engine_idx, record)

    def _join(self, request_id: str, front: FrontTimes, engine_idx: int, record) -> None:
        api = self.api.pop(request_id, ApiTimes(0.0))
        encoder, ec_load = record[ENCODER] / 1e9, record[EC_LOAD] / 1e9
        # The render is the rest of the API server's processing, so the three add up to it.
        parts = {stages.TTFT_MEDIA: api.media_s,
                 stages.TTFT_RENDER: api.api_s - api.media_s - api.processor_s,
                 stages.TTFT_PROCESSOR: api.processor_s, stages.TTFT_QUEUE: front.queue_s,
                 stages.TTFT_ENCODER: encoder, stages.TTFT_EC_LOAD: ec_load,
                 stages.TTFT_PREFILL: front.prefill_s - encoder - ec_load}
        parts[stages.TTFT_OTHER] = front.ttft_s - sum(parts.values())
        self.ready.append(TtftSplit(front.external_id, engine_idx, not record[COMPUTED],
                                    front.ttft_s, parts, request_id))

    def drain(self) -> list[TtftSplit]:
        ready, self.ready = self.ready, []
        return ready


def probe_line(split: TtftSplit) -> str:
    """One grep-able line per multimodal request: its id, the outcome, the parts in seconds."""
    parts = " ".join(f"{p}={split.parts[p]:.6f}" for p in stages.TTFT_PARTS)
    outcome = "hit" if split.hit else "miss"
    return f"mm_ttft_probe req={split.request_id} encoder_cache={outcome} " \
           f"ttft={split.ttft_s:.6f} {parts}"
