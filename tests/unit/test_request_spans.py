"""What mmscope adds to vLLM's request span, without an engine: EngineCore's record of a request
tallied from the real ledger (only where vLLM traces requests), the API server's join that holds
a span until its record and split arrive (once, whichever comes first), the attributes, and the
child spans laid on the request's timeline adding up to its TTFT."""
from __future__ import annotations

from types import SimpleNamespace

from mmscope.carry import request_facts as rf, ttft_split as ttft
from mmscope.carry.ledger import Decision, Item
from mmscope.carry.span_join import HELD, HOLD_S, SpanJoin
from mmscope.expose import otlp
from mmscope.vllm.engine_core.state import EngineState

PARTS = {"media": 0.006, "render": 0.003, "processor": 0.001, "queue": 0.002, "encoder": 0.030,
         "ec_load": 0.004, "prefill": 0.050, "other": 0.003}


def item(req, idx, modality="image", embeds=16):
    return Item(req, idx, modality, f"h-{req}-{idx}", embeds)


def test_engine_records_carry_facts_only_where_vllm_traces_requests():
    state = EngineState(SimpleNamespace(cache_size=1000))
    # each item's way is the only sink: nothing per request
    assert state.ledger.probe == state.ways.committed and state.shares.extra == {}
    state.trace_requests()
    state.shares.admit("a", rf.items(["image", "image", "video"]))
    ledger = state.ledger
    ledger.propose(item("a", 0), Decision.COMPUTE)
    ledger.propose(item("a", 1), Decision.LOCAL_HIT)
    ledger.propose(item("a", 2, "video", 40), Decision.DEFERRED)
    ledger.prefix_covered(item("b", 0, embeds=9))  # a request not admitted yet: recorded all the same
    ledger.commit_step({"a": 8}, {"a": [0]})
    record = state.shares.open["a"]
    assert {k: v for k, v in record.items() if v} == {
        "items.image": 2, "items.video": 1, rf.MISSES: 1, rf.HITS + "local": 1, rf.DEFERRALS: 1,
        rf.COMPUTED_EMBEDS: 16, rf.SPARED_EMBEDS: 16}
    assert set(record) >= set(rf.COUNTS) | set(ttft.SHARES)
    assert state.shares.open["b"][rf.PREFIX_COVERED] == 1
    assert state.shares.open["b"][rf.SPARED_EMBEDS] == 9


def split(request_id="r-1", ttft_s=None, parts=PARTS):
    return ttft.TtftSplit("chatcmpl-1", 0, False, ttft_s or sum(parts.values()), dict(parts),
                          request_id)


def test_attributes_name_the_facts_and_the_parts_in_vllms_style():
    record = {ttft.ENCODER: 5, ttft.EC_LOAD: 0, ttft.COMPUTED: 1, "items.image": 1, rf.MISSES: 1}
    assert otlp.attributes(record, split()) == {
        "gen_ai.multimodal.items.image": 1, "gen_ai.multimodal.encoder_cache.misses": 1,
        **{f"gen_ai.latency.ttft_part.{p}": v for p, v in PARTS.items()}}
    assert otlp.attributes(None, None) == {}


def test_child_spans_tile_the_ttft_in_the_order_of_time():
    arrival = 1_700_000_000.25
    queued = arrival + 0.010 + 0.001  # EngineCore queued it 1 ms after the API server was done
    spans = otlp.layout(split(), arrival, queued)
    assert [name for name, *_ in spans] == [
        "ttft.media", "ttft.render", "ttft.processor", "ttft.other", "ttft.queue", "ttft.ec_load",
        "ttft.encoder", "ttft.prefill", "ttft.other"]
    start = int(arrival * 1e9)
    assert spans[0][1] == start and spans[-1][2] == start + round(sum(PARTS.values()) * 1e9)
    assert all(a[2] == b[1] for a, b in zip(spans, spans[1:]))
    lengths = [end - begin for _, begin, end in spans]
    assert lengths[:3] == [6_000_000, 3_000_000, 1_000_000]
    assert abs(lengths[3] - 1_000_000) < 1000 and abs(lengths[3] + lengths[-1] - 3_000_000) < 10
    assert lengths[4:8] == [2_000_000, 4_000_000, 30_000_000, 50_000_000]


def test_parts_of_no_length_get_no_span_and_the_way_in_never_exceeds_other():
    parts = dict(PARTS, encoder=0.0, ec_load=0.0)
    spans = otlp.layout(split(parts=parts), 100.0, 100.0 + 5.0)  # a clock far off: capped
    assert [name for name, *_ in spans] == [
        "ttft.media", "ttft.render", "ttft.processor", "ttft.other", "ttft.queue", "ttft.prefill"]
    assert spans[3][2] - spans[3][1] == round(parts["other"] * 1e9)


def made(calls):
    return lambda record, got_split: calls.append((record, got_split))


def test_a_span_whole_when_traced_goes_at_once_and_others_are_left_alone():
    join = SpanJoin(wants_split=True)
    join.expect("r-1")
    join.arrived({"r-1": {"x": 1}, "text": {"x": 2}}, [split("r-1"), split("text")])
    assert join.traced("text", made([]), 0.0) is None  # not multimodal: vLLM's span as it is
    record, got = join.traced("r-1", made([]), 0.0)
    assert record == {"x": 1} and got.internal_id == "r-1"
    assert not (join.expected or join.records or join.splits or join.held)


def test_a_held_span_goes_once_when_its_record_and_split_arrive():
    join, calls = SpanJoin(wants_split=True), []
    join.expect("r-1")
    assert join.traced("r-1", made(calls), 0.0) is HELD
    join.arrived({"r-1": {"x": 1}}, [])
    assert calls == []  # the split is still to come
    join.arrived({}, [split("r-1")])
    join.arrived({}, [])
    join.expired(HOLD_S + 1)
    join.release_all()
    assert [(r, s.internal_id) for r, s in calls] == [({"x": 1}, "r-1")]


def test_without_the_split_a_record_is_enough_and_a_lost_one_waits_hold_s():
    join, calls = SpanJoin(wants_split=False), []
    for r in ("r-1", "r-2"):
        join.expect(r)
        join.traced(r, made(calls), 10.0)
    join.arrived({"r-1": {"x": 1}}, [])
    assert calls == [({"x": 1}, None)]
    join.expired(10.0 + HOLD_S - 0.1)
    assert len(calls) == 1
    join.expired(10.0 + HOLD_S)
    assert calls[1] == (None, None) and not join.held


def test_held_spans_go_at_exit():
    join, calls = SpanJoin(wants_split=True), []
    join.expect("r-1")
    join.traced("r-1", made(calls), 0.0)
    join.release_all()
    assert calls == [(None, None)]


def test_without_tracing_nothing_is_applied_per_request():
    """vLLM's output processor made without tracing_enabled: the request span's rows stay off,
    vLLM's add_request and do_tracing are its own."""
    import inspect

    import wrapt
    from vllm.v1.engine.output_processor import OutputProcessor

    from mmscope.vllm.instrumentor import get_instrumentor

    instrumentor = get_instrumentor()
    was_instrumented = instrumentor.instrumented
    instrumentor.instrument()
    try:
        assert isinstance(inspect.getattr_static(OutputProcessor, "__init__"), wrapt.FunctionWrapper)
        OutputProcessor(None, log_stats=True, tracing_enabled=False)
        assert {h.name: h.status for h in instrumentor.table if h.when == "once vLLM traces requests"} == {
            "otlp.request_added": "not applied", "otlp.request_span": "not applied"}
        for method in ("add_request", "do_tracing"):
            assert not isinstance(inspect.getattr_static(OutputProcessor, method),
                                  wrapt.FunctionWrapper)
    finally:
        if not was_instrumented:
            instrumentor.uninstrument()
