"""Each item's way through the cache layers: EngineCore's outcomes from the real ledger, the
processor cache's answers by hash, their join, and what each layer saved."""
from __future__ import annotations

from collections import Counter

import pytest

from mmscope.carry import counts, item_ways
from mmscope.carry.item_ways import (EncoderCosts, EngineCostTotals, EngineWays, ProcessorCosts,
                                     ProcessorWays, join, prompt_hits)
from mmscope.carry.ledger import Decision, EncoderCacheLedger, Item
from mmscope.vocabulary import EncoderWay, Layer, ProcessorWay

E = 16  # embeddings per image


def item(request: str, index: int, mm_hash: str, modality: str = "image", embeds: int = E):
    return Item(request, index, modality, mm_hash, embeds, mm_hash)


def step(ledger, decisions, computed=()):
    """One scheduler step: each (item, decision) proposed, then committed for their requests."""
    for it, decision in decisions:
        ledger.propose(it, decision)
    ledger.commit_step({it.request_id for it, _ in decisions},
                       {it.request_id: [it.index] for it in computed})


def by_axis(joined) -> tuple[Counter, Counter]:
    """(processor way -> items, encoder way -> items) of a join."""
    processor, encoder = Counter(), Counter()
    for key, n in joined.counts.items():
        kind, labels = counts.split(key)
        if kind == item_ways.ITEMS:
            processor[labels[1]] += n
            encoder[labels[2]] += n
    return processor, encoder


def test_the_ledger_sends_each_items_way_at_its_final_outcome():
    ways = EngineWays()
    ledger = EncoderCacheLedger(probe=ways.committed)
    a, b = item("r1", 0, "A"), item("r1", 1, "B")
    step(ledger, [(a, Decision.COMPUTE), (b, Decision.DEFERRED)], computed=[a])
    assert ways.drain() == [("A", "image", EncoderWay.COMPUTED, E)]  # a deferral is no outcome
    step(ledger, [(b, Decision.ALLOCATED)])  # with a connector, not computed: loaded
    step(ledger, [(item("r2", 0, "A"), Decision.LOCAL_HIT)])
    step(ledger, [(item("r3", 0, "A"), Decision.DUPLICATE)])
    ledger.prefix_covered(item("r4", 0, "C", "video", 4000))
    assert ways.drain() == [("B", "image", EncoderWay.EC_LOADED, E),
                            ("A", "image", EncoderWay.CACHE_HIT, E),
                            ("A", "image", EncoderWay.CACHE_HIT, E),
                            ("C", "video", EncoderWay.PREFIX_COVERED, 4000)]


def test_an_item_committed_again_after_preemption_is_sent_once():
    """The ledger counts a resumed request's items again (docs/design.md §4); their way is one."""
    ways = EngineWays()
    ledger = EncoderCacheLedger(probe=ways.committed)
    a = item("r1", 0, "A")
    step(ledger, [(a, Decision.COMPUTE)], computed=[a])
    ways.preempted("r1", ledger.committed("r1")), ledger.forget("r1")  # its entries freed
    step(ledger, [(a, Decision.COMPUTE)], computed=[a])
    assert ledger.drain().queries == 2
    assert ways.drain() == [("A", "image", EncoderWay.COMPUTED, E)]
    ways.finished("r1"), ledger.forget("r1")  # finished: what was kept of it goes
    step(ledger, [(item("r1", 0, "A"), Decision.LOCAL_HIT)])
    assert [w[2] for w in ways.drain()] == [EncoderWay.CACHE_HIT]


def test_a_later_copy_in_the_same_prompt_hits_as_vllm_counts_it():
    """Both copies of A were looked up before either was added; vLLM's cache statistics count
    the second get a hit once the first was added (it fitted)."""
    hashes = {"image": ["A", "A", "B"]}
    found = {"image": [False, False, True]}
    assert prompt_hits(hashes, found, held=lambda h: True) == [("A", False), ("A", True),
                                                               ("B", True)]
    assert prompt_hits(hashes, found, held=lambda h: False) == [("A", False), ("A", False),
                                                                ("B", True)]


def test_answers_wait_by_hash_oldest_first_and_unknown_items_are_off():
    waiting = ProcessorWays()
    waiting.looked_up([("A", False), ("B", False)])
    waiting.looked_up([("A", True)])
    assert waiting.take(["A", "A", "A"]) == ["miss", "hit", "off"]
    assert waiting.take(["B"]) == [ProcessorWay.MISS] and waiting.waiting == 0
    assert waiting.take(["never looked up"]) == [ProcessorWay.OFF]


def test_answers_never_joined_are_dropped_oldest_hash_first():
    waiting = ProcessorWays(bound=3)
    waiting.looked_up([("A", False), ("A", True), ("B", False)])
    waiting.looked_up([("C", False)])  # over the bound: A's answers go
    assert waiting.waiting == 2
    assert waiting.take(["A", "B", "C"]) == [ProcessorWay.OFF, ProcessorWay.MISS, ProcessorWay.MISS]


def chats(processor_cache: bool):
    """Chats A, A, B, A, A+B through the ledger and, with its cache on, the processor."""
    waiting, ways = ProcessorWays(), EngineWays()
    ledger = EncoderCacheLedger(probe=ways.committed)
    held, encoded = set(), set()  # in the processor cache, in the encoder cache
    for n, images in enumerate((["A"], ["A"], ["B"], ["A"], ["A", "B"])):
        if processor_cache:
            waiting.looked_up(prompt_hits({"image": images}, {"image": [h in held for h in images]},
                                          held.__contains__))
            held.update(images)
        items = [item(f"r{n}", i, h) for i, h in enumerate(images)]
        new = [it for it in items if it.key not in encoded]
        step(ledger, [(it, Decision.COMPUTE if it in new else Decision.LOCAL_HIT) for it in items],
             computed=new)
        encoded.update(images)
    return waiting, ways.drain()


@pytest.mark.parametrize("processor_cache", [True, False])
def test_chats_a_a_b_a_ab_join_as_vllm_and_the_ledger_count_them(processor_cache):
    waiting, sent = chats(processor_cache)
    costs = EngineCostTotals()
    joined = join(sent, waiting, ProcessorCosts(), costs)
    processor, encoder = by_axis(joined)
    if processor_cache:
        assert processor == {ProcessorWay.HIT: 4, ProcessorWay.MISS: 2}
    else:
        assert processor == {ProcessorWay.OFF: 6}
    assert encoder == {EncoderWay.COMPUTED: 2, EncoderWay.CACHE_HIT: 4}
    assert waiting.waiting == 0  # every answer joined
    assert joined.sizes == [("image", E)] * 6


def test_each_layer_saves_its_skipped_stages_measured_cost():
    """The HF processor: 30 ms for two images, 15 ms each; the encoder: 8 ms for 16 embeddings
    of images, 0.5 ms per embedding; an EC load of 16 embeddings in 2 ms."""
    hf = ProcessorCosts()
    hf.processed({"image": 2}, 30_000_000)
    engine = EncoderCosts()
    engine.encoded(8_000_000, [("image", E)])
    engine.loaded(2_000_000, [("image", E)])
    costs = EngineCostTotals()
    costs.add(engine.drain())
    assert costs.encoder_ns_per_embed("image") == 500_000 and costs.modalities() == ["image"]
    waiting = ProcessorWays()
    waiting.looked_up([("A", True), ("B", True), ("C", True), ("D", False)])
    sent = [("A", "image", EncoderWay.CACHE_HIT, E), ("B", "image", EncoderWay.PREFIX_COVERED, E),
            ("C", "image", EncoderWay.EC_LOADED, E), ("D", "image", EncoderWay.COMPUTED, E)]
    saved = {counts.split(k)[1][0]: n for k, n in join(sent, waiting, hf, costs).counts.items()
             if counts.split(k)[0] == item_ways.SAVED_NS}
    assert saved == {Layer.PROCESSOR_CACHE: 3 * 15_000_000, Layer.ENCODER_CACHE: 8_000_000,
                     Layer.PREFIX_CACHE: 8_000_000, Layer.EC_CONNECTOR: 6_000_000}


def test_what_is_not_measured_yet_saves_nothing_and_a_slow_load_saves_nothing():
    costs = EngineCostTotals()
    assert costs.saved_ns(EncoderWay.CACHE_HIT, "image", E) == 0  # the encoder never ran
    engine = EncoderCosts()
    engine.encoded(1_000_000, [("image", E)])
    engine.loaded(5_000_000, [("image", E)])
    costs.add(engine.drain())
    assert costs.saved_ns(EncoderWay.EC_LOADED, "image", E) == 0  # never below 0
    assert costs.saved_ns(EncoderWay.CACHE_HIT, "video", E) == 0  # another modality's cost


def test_a_steps_time_is_shared_among_its_modalities_by_embeddings():
    engine = EncoderCosts()
    engine.encoded(10_000, [("image", 16), ("video", 48), ("image", 16)])
    assert engine.drain() == {"encoder_ns:image": 4_000, "encoder_embeds:image": 32,
                              "encoder_ns:video": 6_000, "encoder_embeds:video": 48}
    engine.encoded(0, [("image", 16)])  # stage timings off: nothing measured
    assert not engine.pending


def test_every_items_series_key_exists_for_each_modality():
    keys = item_ways.item_keys(["image", "audio"])
    assert len(keys) == 2 * len(ProcessorWay) * len(EncoderWay) == 24
    assert counts.key(item_ways.ITEMS, "audio", "off", "ec_loaded") in keys
    assert len(item_ways.saved_keys()) == len(Layer)


def test_the_layers_read_back_from_a_metrics_page_and_said_in_two_lines():
    from prometheus_client import CollectorRegistry, Counter as PromCounter, Gauge, Histogram
    from prometheus_client import generate_latest
    import functools

    from mmscope.expose import layers, readout
    from mmscope.expose.metrics import EncoderCacheProm, MetricClasses

    registry = CollectorRegistry()
    classes = (functools.partial(cls, registry=registry) for cls in (PromCounter, Gauge, Histogram))
    prom = EncoderCacheProm(MetricClasses(*classes), {0: ["tiny", "0"]}, ["image"])
    page = readout.from_prometheus_text(generate_latest(registry).decode())
    assert layers.read(page)["items"] == 0  # the series exist from the start
    assert layers.read({"encoder_cache_queries": 3.0}) is None  # a page without them
    waiting = ProcessorWays()
    waiting.looked_up([("A", False), ("A", True), ("B", True)])
    costs = EngineCostTotals()
    costs.add({"encoder_ns:image": 16_000_000, "encoder_embeds:image": E})
    sent = [("A", "image", EncoderWay.COMPUTED, E), ("A", "image", EncoderWay.CACHE_HIT, E),
            ("B", "image", EncoderWay.PREFIX_COVERED, E)]
    prom.observe_ways(join(sent, waiting, ProcessorCosts(), costs), costs, 0)
    ways = layers.read(readout.from_prometheus_text(generate_latest(registry).decode()))
    assert ways["items"] == 3
    assert ways["encoder"] == {"cache_hit": 1, "prefix_covered": 1, "ec_loaded": 0, "computed": 1}
    assert ways["processor"] == {"hit": 2, "miss": 1, "off": 0}
    assert ways["saved_s"]["encoder_cache"] == ways["saved_s"]["prefix_cache"] == 0.016
    assert layers.lines(ways) == [
        "items served from: encoder cache 1, prefix cache 1, encoder 1 (3 items; processor cache "
        "hit 2, miss 1)",
        "work saved: 0.032 s (prefix cache 0.016 s, encoder cache 0.016 s)"]
