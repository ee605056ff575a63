"""The API server: each multimodal request's span waits, at most HOLD_S, until what it carries is
there: EngineCore's record of the request and, with the TTFT split on, its split (docs/design.md
§5a). Independent of vLLM and of OpenTelemetry: a held span is a call, made exactly once."""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

from mmscope.carry.ttft_split import TtftSplit, bounded_put

# EngineCore sends a traced request's record with its first token, so a span waits at most until
# the end of the output loop's turn that finished it; beyond this, something was lost on the way
# (a hook turned off, a stats update that never came) and the span goes with what has arrived.
HOLD_S = 5.0

HELD = "held"
Emit = Callable[[dict | None, TtftSplit | None], None]  # (record, split) -> the span made


class SpanJoin:
    """Multimodal requests (`expect`), their records and splits as they arrive, and the spans
    held for them (`traced`). Tables are bounded as the split's are: a request aborted before
    vLLM traces it leaves nothing behind for long."""

    def __init__(self, wants_split: bool):
        self.wants_split = wants_split
        self.expected: OrderedDict[str, None] = OrderedDict()
        self.records: OrderedDict[str, dict[str, int]] = OrderedDict()
        self.splits: OrderedDict[str, TtftSplit] = OrderedDict()
        self.held: dict[str, tuple[float, Emit]] = {}

    def expect(self, request_id: str) -> None:
        bounded_put(self.expected, request_id, None)

    def arrived(self, records: dict[str, dict[str, int]], splits: list[TtftSplit]) -> None:
        """Records from EngineCore, splits from the TTFT join: each held span now whole goes."""
        for request_id, record in records.items():
            if request_id in self.expected:
                bounded_put(self.records, request_id, record)
        for split in splits:
            if split.internal_id in self.expected:
                bounded_put(self.splits, split.internal_id, split)
        for request_id in list(self.held):  # a copy: the sweeping thread may release one
            if self._whole(request_id):
                self._release(request_id)

    def traced(self, request_id: str, emit: Emit, now: float):
        """vLLM traces the request now. None: it is not multimodal (vLLM's span as it is);
        (record, split): its span is whole, to be made now; HELD: `emit` makes it once it is
        whole, or at now + HOLD_S."""
        if request_id not in self.expected:
            return None
        if self._whole(request_id):
            self.expected.pop(request_id, None)
            return self.records.pop(request_id, None), self.splits.pop(request_id, None)
        self.held[request_id] = (now + HOLD_S, emit)
        return HELD

    def expired(self, now: float) -> None:
        for request_id, (deadline, _) in list(self.held.items()):
            if deadline <= now:
                self._release(request_id)

    def release_all(self) -> None:
        for request_id in list(self.held):
            self._release(request_id)

    def _whole(self, request_id: str) -> bool:
        return request_id in self.records and (not self.wants_split or request_id in self.splits)

    def _release(self, request_id: str) -> None:
        held = self.held.pop(request_id, None)  # one caller wins: the span is made once
        if held is None:
            return
        self.expected.pop(request_id, None)
        held[1](self.records.pop(request_id, None), self.splits.pop(request_id, None))
