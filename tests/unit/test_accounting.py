"""The accounting core: exact counts for scripted steps, and properties against a plain model."""
from __future__ import annotations

from collections import Counter

from hypothesis import given, settings, strategies as st

from mmscope.carry.ledger import Decision, EncoderCacheLedger, Item, probe_line

D = Decision


def item(req, idx, key=None, modality="image", embeds=None):
    """Items of different sizes: a request's item idx has 16 * (idx + 1) embeddings."""
    return Item(req, idx, modality, key or f"h-{req}-{idx}", embeds or 16 * (idx + 1))


def test_a_miss_needs_the_encoder_to_be_scheduled():
    led = EncoderCacheLedger()
    led.propose(item("a", 0), D.COMPUTE)
    led.propose(item("b", 0), D.COMPUTE)
    # b was probed but not scheduled (e.g. no KV blocks): nothing of it counts.
    led.commit_step({"a": 10}, {"a": [0]})
    s = led.drain()
    assert (s.queries, s.hits, s.misses, s.deferrals, s.requests) == (1, 0, 1, 0, 1)


def test_deferred_items_count_only_as_deferrals_until_committed():
    led = EncoderCacheLedger()
    led.propose(item("a", 0), D.COMPUTE)
    led.propose(item("a", 1), D.DEFERRED)
    led.commit_step({"a": 5}, {"a": [0]})
    s = led.drain()
    assert (s.queries, s.misses, s.deferrals) == (1, 1, 1)
    led.propose(item("a", 1), D.COMPUTE)
    led.commit_step({"a": 5}, {"a": [1]})
    s = led.drain()
    assert (s.queries, s.misses, s.deferrals) == (1, 1, 0)


def test_chunked_prefill_counts_each_item_once_until_freed():
    led = EncoderCacheLedger()
    led.propose(item("a", 0), D.COMPUTE)
    led.commit_step({"a": 8}, {"a": [0]})
    led.propose(item("a", 0), D.LOCAL_HIT)  # next chunk sees its own entry
    led.commit_step({"a": 8}, {})
    assert led.drain().queries == 1
    led.forget("a")  # preempted: entries freed
    led.propose(item("a", 0), D.LOCAL_HIT)
    led.commit_step({"a": 8}, {})
    s = led.drain()
    assert (s.queries, s.hits, s.hits_by_source) == (1, 1, Counter(local=1))


def test_sources_local_in_step_connector():
    led = EncoderCacheLedger()
    led.propose(item("a", 0, "x"), D.COMPUTE)
    led.propose(item("a", 1, "x"), D.DUPLICATE)
    led.allocated("x")
    led.propose(item("b", 0, "x"), D.LOCAL_HIT)  # resident only because a computes it now
    led.propose(item("c", 0, "y"), D.CONNECTOR)
    led.propose(item("d", 0, "z", "video"), D.LOCAL_HIT)
    led.commit_step({"a": 1, "b": 1, "c": 1, "d": 1}, {"a": [0]})
    s = led.drain()
    assert (s.queries, s.hits, s.misses) == (5, 4, 1)
    assert s.hits_by_source == Counter(in_step=2, connector=1, local=1)
    assert s.queries_by_modality == Counter(image=4, video=1)
    assert s.hits_by_modality == Counter(image=3, video=1)
    # In embeddings: a's second copy is item 1 (32), the others item 0 (16 each).
    assert (s.query_embeds, s.hit_embeds, s.miss_embeds) == (96, 80, 16)
    assert s.hit_embeds_by_source == Counter(in_step=48, connector=16, local=16)
    assert s.query_embeds_by_modality == Counter(image=80, video=16)
    assert s.hit_embeds_by_modality == Counter(image=64, video=16)


def test_a_large_item_weighs_what_it_costs():
    """One hit on a 4,000-embedding video and one miss on a 64-embedding thumbnail: half the items
    hit, but 98% of the encoder's work was spared."""
    led = EncoderCacheLedger()
    led.propose(item("a", 0, "video-1", "video", embeds=4000), D.LOCAL_HIT)
    led.propose(item("b", 0, "thumb-1", "image", embeds=64), D.COMPUTE)
    led.prefix_covered(item("c", 0, "thumb-2", "image", embeds=64))
    led.commit_step({"a": 1, "b": 1, "c": 1}, {"b": [0]})
    s = led.drain()
    assert (s.queries, s.hits) == (2, 1)
    assert (s.query_embeds, s.hit_embeds, s.miss_embeds, s.prefix_covered_embeds) == (
        4064, 4000, 64, 64)


def test_probe_lines_carry_ids_counts_and_hash_prefix_only():
    lines = []
    led = EncoderCacheLedger(probe=lambda o, i, s: lines.append(probe_line(o, i, s)))
    led.propose(Item("r1", 0, "image", "3f2a" * 16, 576), D.LOCAL_HIT)
    led.propose(Item("r1", 1, "image", "beef" * 16, 576), D.DEFERRED)
    led.commit_step({"r1": 1}, {})
    assert lines == [
        "mm_cache_probe HIT source=local req=r1 item=0 modality=image hash=3f2a3f2a3f2a3f2a embeds=576",
        "mm_cache_probe DEFERRED req=r1 item=1 modality=image hash=beefbeefbeefbeef embeds=576",
    ]


def test_wire_round_trip_and_add():
    led = EncoderCacheLedger()
    led.propose(item("a", 0, "x"), D.COMPUTE)
    led.propose(item("b", 0, "y"), D.CONNECTOR)
    led.evicted(2)
    led.occupancy(32, 256)
    led.commit_step({"a": 1, "b": 1}, {"a": [0]})
    s = led.drain()
    assert s.to_wire() == {"requests": 2, "queries": 2, "hits": 1, "misses": 1, "deferrals": 0,
                           "evictions": 2, "prefix_covered": 0, "hits_by_source:connector": 1,
                           "queries_by_modality:image": 2, "hits_by_modality:image": 1,
                           "query_embeds": 32, "hit_embeds": 16, "miss_embeds": 16,
                           "prefix_covered_embeds": 0, "hit_embeds_by_source:connector": 16,
                           "query_embeds_by_modality:image": 32,
                           "hit_embeds_by_modality:image": 16,
                           "usage_embeds": 32, "capacity_embeds": 256}
    assert all(type(v) is int for v in s.to_wire().values())
    # Occupancy carries over a drain; counts do not.
    nxt = led.drain()
    assert (nxt.queries, nxt.usage_embeds, nxt.capacity_embeds) == (0, 32, 256)


# --- property test against a plain model -------------------------------------------------------
decisions = st.sampled_from(list(Decision))
proposal = st.tuples(st.sampled_from("abc"), st.integers(0, 2), decisions)
covered = st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 2)), max_size=3)
# proposals, scheduled, forgotten after, prefix-covered at the commit
step = st.tuples(st.lists(proposal, max_size=6), st.sets(st.sampled_from("abc")),
                 st.sets(st.sampled_from("abc")), covered)


def decided(proposals):
    """One decision per (request, item) and step: the last proposed, but a duplicate stays one."""
    last = {}
    for req, idx, dec in proposals:
        if last.get((req, idx)) is not Decision.DUPLICATE:
            last[req, idx] = dec
    return last


def runs_encoder(idx, dec) -> bool:
    """The items the encoder computes in the script: every COMPUTE, and the even-numbered items
    reserved with a connector present (the odd ones the connector loads)."""
    return dec is Decision.COMPUTE or (dec is Decision.ALLOCATED and idx % 2 == 0)


def reference(steps):
    """docs/design.md §4 restated plainly: a (request, item) counts once per residency, as a query or
    as prefix-covered, whichever comes first; prefix-covered is no query."""
    q = h = m = d = pc = 0
    embeds = Counter()  # the same outcomes weighed by their items' embeddings
    done: dict[str, set] = {r: set() for r in "abc"}
    for proposals, scheduled, forgotten, spared in steps:
        for req, idx in spared:
            if idx not in done[req]:
                done[req].add(idx)
                pc += 1
                embeds["prefix_covered"] += item(req, idx).embeds
        for (req, idx), dec in decided(proposals).items():
            if dec is Decision.DEFERRED:
                d += 1
            elif req in scheduled and idx not in done[req]:
                done[req].add(idx)
                q += 1
                hit = not runs_encoder(idx, dec)
                h, m = h + hit, m + (not hit)
                embeds["hit" if hit else "miss"] += item(req, idx).embeds
        for req in forgotten:
            done[req] = set()
    return (q, h, m, d, pc), (embeds["hit"] + embeds["miss"], embeds["hit"], embeds["miss"],
                              embeds["prefix_covered"])


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=8))
def test_ledger_matches_reference_model(steps):
    led = EncoderCacheLedger()
    total = Counter()  # the wire forms added up, as the API server's loggers do
    for proposals, scheduled, forgotten, spared in steps:
        computed: dict[str, list[int]] = {}
        for req, idx, dec in proposals:
            led.propose(item(req, idx), dec)
        for req, idx in spared:  # found at the commit, before the step's proposals commit
            led.prefix_covered(item(req, idx))
        for (req, idx), dec in decided(proposals).items():
            if runs_encoder(idx, dec):
                computed.setdefault(req, []).append(idx)
        led.commit_step(scheduled, {r: v for r, v in computed.items() if r in scheduled})
        for req in forgotten:
            led.forget(req)
        s = led.drain()
        assert s.queries == s.hits + s.misses
        assert sum(s.hits_by_source.values()) == s.hits
        assert sum(s.queries_by_modality.values()) == s.queries
        assert sum(s.prefix_covered_by_modality.values()) == s.prefix_covered
        assert s.query_embeds == s.hit_embeds + s.miss_embeds
        assert sum(s.hit_embeds_by_source.values()) == s.hit_embeds
        assert sum(s.query_embeds_by_modality.values()) == s.query_embeds
        total.update(s.to_wire())
    counted = (total["queries"], total["hits"], total["misses"], total["deferrals"],
               total["prefix_covered"])
    weighed = (total["query_embeds"], total["hit_embeds"], total["miss_embeds"],
               total["prefix_covered_embeds"])
    assert (counted, weighed) == reference(steps)


def test_no_news_until_something_changes():
    led = EncoderCacheLedger()
    led.occupancy(0, 64)
    assert led.has_news  # the capacity itself is news the first time
    first = led.drain()
    assert (first.usage_embeds, first.capacity_embeds, first.queries) == (0, 64, 0)
    led.occupancy(0, 64)
    assert not led.has_news  # a decode step: nothing counted, nothing moved
    led.occupancy(16, 64)
    assert led.has_news and led.drain().usage_embeds == 16
    led.propose(item("a", 0), D.DEFERRED)
    led.commit_step({}, {})
    assert led.has_news
    s = led.drain()
    assert (s.deferrals, s.usage_embeds) == (1, 16)
    assert not led.has_news
    led.evicted(2)
    assert led.has_news and led.drain().evictions == 2

def test_one_decision_per_item_and_step_and_nothing_replaces_a_duplicate():
    led = EncoderCacheLedger()
    led.propose(item("a", 0, "x"), D.LOCAL_HIT)
    led.propose(item("a", 0, "x"), D.COMPUTE)  # a later decision for the same item replaces it
    led.propose(item("a", 1, "x"), D.DUPLICATE)
    # When the scheduler reserves space for the first copy, it checks the duplicate against the
    # cache once more: resident by then, but no hit of its own.
    led.propose(item("a", 1, "x"), D.LOCAL_HIT)
    assert led.proposals and sorted(led.proposals["a"]) == [0, 1]
    led.commit_step({"a": 1}, {"a": [0]})
    assert not led.proposals  # the same dict, emptied: the engine adapter's guard reads it
    s = led.drain()
    assert (s.queries, s.hits, s.misses, dict(s.hits_by_source)) == (2, 1, 1, {"in_step": 1})


def test_reserved_with_a_connector_is_a_miss_when_computed_else_a_connector_hit():
    led = EncoderCacheLedger()
    led.propose(item("a", 0, "x"), D.ALLOCATED)  # computed this step
    led.propose(item("a", 1, "y"), D.ALLOCATED)  # loaded by the connector
    led.propose(item("b", 0, "z"), D.ALLOCATED)  # b not scheduled after all: nothing counts
    led.commit_step({"a": 1}, {"a": [0]})
    s = led.drain()
    assert (s.queries, s.hits, s.misses, s.requests) == (2, 1, 1, 1)
    assert dict(s.hits_by_source) == {"connector": 1}
    led.propose(item("a", 1, "y"), D.ALLOCATED)  # chunked prefill: counted once
    led.commit_step({"a": 1}, {})
    assert led.drain().queries == 0


# --- prefix-covered items: encoder work the prefix cache spared, not a query ------------------
def test_a_prefix_covered_item_is_counted_once_and_is_no_query():
    led = EncoderCacheLedger()
    led.prefix_covered(item("a", 0))
    led.prefix_covered(item("a", 0))  # the same (request, item) again: once
    led.prefix_covered(item("a", 1, modality="video"))
    led.propose(item("a", 2), D.COMPUTE)  # the item after the cached prefix: computed
    led.commit_step({"a": 4}, {"a": [2]})
    s = led.drain()
    assert (s.prefix_covered, s.queries, s.hits, s.misses) == (2, 1, 0, 1)
    assert s.queries == s.hits + s.misses
    assert s.prefix_covered_by_modality == Counter(image=1, video=1)
    assert s.queries_by_modality == Counter(image=1) and not s.hits_by_modality
    assert s.requests == 1  # the request that committed a query
    wire = s.to_wire()
    assert (wire["prefix_covered"], wire["prefix_covered_by_modality:image"],
            wire["prefix_covered_by_modality:video"]) == (2, 1, 1)
    assert not s.empty


def test_a_prefix_covered_item_is_not_counted_again_by_a_later_chunk():
    led = EncoderCacheLedger()
    led.prefix_covered(item("a", 0))
    # vLLM's window never reaches the item; were it looked up (resident from another request),
    # the lookup is no query of its own
    led.propose(item("a", 0), D.LOCAL_HIT)
    led.commit_step({"a": 8}, {})
    s = led.drain()
    assert (s.prefix_covered, s.queries, s.hits, s.requests) == (1, 0, 0, 1)


def test_requests_are_those_that_sent_items_once_per_step_queried_or_prefix_covered():
    """The unit of the stats line's windows: vLLM's CachingMetrics drops an observation of no
    requests, so a step whose only items were prefix-covered must still count its request."""
    led = EncoderCacheLedger()
    led.prefix_covered(item("a", 0))  # covered only
    led.prefix_covered(item("b", 0))  # covered and queried: one request
    led.propose(item("b", 1), D.COMPUTE)
    led.propose(item("c", 0), D.LOCAL_HIT)  # queried only
    led.commit_step({"a": 4, "b": 4, "c": 4}, {"b": [1]})
    assert led.drain().requests == 3
    led.commit_step({"a": 1}, {})  # a later step of nothing new
    assert led.drain().requests == 0


def test_prefix_covered_again_after_forget():
    led = EncoderCacheLedger()
    led.prefix_covered(item("a", 0))
    led.forget("a")  # preempted: its entries freed, resumed later over the cached prefix
    led.prefix_covered(item("a", 0))
    s = led.drain()
    assert (s.prefix_covered, s.queries) == (2, 0)
    led.forget("a")
    led.propose(item("a", 0), D.COMPUTE)  # resumed without the prefix: computed, a miss
    led.commit_step({"a": 8}, {"a": [0]})
    s = led.drain()
    assert (s.prefix_covered, s.queries, s.misses) == (0, 1, 1)


def test_an_item_counted_as_a_query_is_not_prefix_covered_later():
    led = EncoderCacheLedger()
    led.propose(item("a", 0), D.COMPUTE)
    led.commit_step({"a": 8}, {"a": [0]})
    led.prefix_covered(item("a", 0))
    s = led.drain()
    assert (s.queries, s.misses, s.prefix_covered) == (1, 1, 0)


def test_prefix_covered_goes_to_the_probe_but_deferrals_and_counts_stay_apart():
    outcomes = []
    led = EncoderCacheLedger(probe=lambda o, i, s: outcomes.append((o, i.index, s)))
    led.prefix_covered(item("a", 0))
    led.propose(item("a", 1), D.DEFERRED)
    led.commit_step({"a": 1}, {})
    assert outcomes == [("PREFIX_COVERED", 0, None), ("DEFERRED", 1, None)]
    s = led.drain()
    assert (s.prefix_covered, s.deferrals, s.queries) == (1, 1, 0)


def test_compute_is_a_miss_even_where_the_step_lists_no_computed_items():
    # vLLM reserves exactly the step's computed items of a scheduled request: a reservation
    # without a connector is a miss, whatever the computed list says
    led = EncoderCacheLedger()
    led.propose(item("a", 0), D.COMPUTE)
    led.commit_step({"a": 1}, {})
    s = led.drain()
    assert (s.queries, s.misses, s.hits) == (1, 1, 0)
