"""EngineCore's wrappers on vLLM's real EncoderCacheManager and Request: each of the scheduler's
questions about an item becomes the ledger's proposal, with vLLM's answers unchanged."""
from __future__ import annotations

import pytest

from mmscope.carry.ledger import Decision
from mmscope.vllm import targets
from mmscope.vllm.engine_core import state as engine_state
from mmscope.vllm.patching import Status

HOOKS = ("encoder_cache.local_hit", "encoder_cache.deferral", "encoder_cache.free")


@pytest.fixture(scope="module", autouse=True)
def applied():
    hooks = [targets.TABLE.by_name[name] for name in HOOKS]
    for hook in hooks:
        assert hook.apply() is Status.APPLIED, hook.describe()
    yield
    for hook in hooks:
        hook.revert()


def request(request_id: str, *keys: str):
    from vllm import SamplingParams
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.v1.request import Request

    features = [MultiModalFeatureSpec(data=None, modality="image", identifier=key,
                                      mm_position=PlaceholderRange(offset=2 + 10 * i, length=8))
                for i, key in enumerate(keys)]
    return Request(request_id=request_id, prompt_token_ids=list(range(12 * len(keys) + 4)),
                   sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                   mm_features=features)


def manager(cache_size=64):
    from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

    return EncoderCacheManager(cache_size=cache_size)


def proposed(mgr) -> dict:
    return {(rid, i): d for rid, looked in engine_state.state_of(mgr).ledger.proposals.items()
            for i, (_, d) in looked.items()}


def test_a_resident_item_is_proposed_as_a_local_hit_and_an_absent_one_not_at_all():
    mgr, a, b = manager(), request("a", "k0"), request("b", "k0")
    assert mgr.check_and_update_cache(a, 0) is False  # vLLM's answer, unchanged
    assert proposed(mgr) == {}
    assert mgr.can_allocate(a, 0, 64, 0) is True
    mgr.allocate(a, 0)
    assert mgr.check_and_update_cache(b, 0) is True
    assert proposed(mgr) == {("b", 0): Decision.LOCAL_HIT}
    item = engine_state.state_of(mgr).ledger.proposals["b"][0][0]
    assert (item.request_id, item.index, item.modality, item.key, item.embeds) == (
        "b", 0, "image", "k0", 8)


def test_no_room_or_budget_is_proposed_as_a_deferral():
    mgr = manager(cache_size=8)
    a, b = request("a", "k0"), request("b", "k1")
    assert mgr.can_allocate(a, 0, 4, 0) is False  # over the encoder compute budget
    assert mgr.can_allocate(b, 0, 64, 0) is True
    mgr.allocate(b, 0)
    assert mgr.can_allocate(a, 0, 64, 0) is False  # the cache is full of b's entry
    assert proposed(mgr) == {("a", 0): Decision.DEFERRED}
    ledger = engine_state.state_of(mgr).ledger
    ledger.commit_step({}, {})
    s = ledger.drain()
    assert (s.deferrals, s.queries) == (1, 0)


def test_freeing_a_request_lets_it_commit_its_items_again():
    mgr, a = manager(), request("a", "k0", "k1")
    ledger = engine_state.state_of(mgr).ledger
    for _ in range(2):
        assert mgr.can_allocate(a, 0, 64, 0) is True
        mgr.allocate(a, 0)
        ledger.propose(engine_state.item_of(a, 0), Decision.COMPUTE)  # what the allocation hook does
        ledger.commit_step({"a"}, {"a": [0]})
        mgr.free(a)  # preempted: its entries released
        assert mgr.get_cached_input_ids(a) == set()
    s = ledger.drain()
    assert (s.queries, s.misses) == (2, 2)


def test_each_manager_has_its_own_ledger_kept_weakly():
    import gc

    first, second = manager(), manager()
    assert engine_state.state_of(first) is engine_state.state_of(first)
    assert engine_state.state_of(first).ledger is not engine_state.state_of(second).ledger
    assert not any(name.startswith("_mmscope") for name in vars(first))  # nothing added to vLLM's
    count = len(engine_state._states)
    del first
    gc.collect()
    assert len(engine_state._states) == count - 1
