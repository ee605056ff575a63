"""The model-free scheduler of tests/kit/vllm034_scheduler.py on vLLM 0.34's real Scheduler: an image request
goes through its encoder step and its decode to the end."""
from __future__ import annotations

from tests.kit.vllm034_scheduler import Driver, Item, create_scheduler, make_request


def test_an_image_request_is_encoded_once_then_decoded_to_its_length(tiny_model):
    scheduler = create_scheduler(tiny_model, max_num_batched_tokens=64, encoder_cache_size=64,
                                 encoder_compute_budget=64)
    driver = Driver(scheduler)
    driver.add(make_request(scheduler, "a", 40, [Item("img-a", offset=4, length=16)],
                            max_tokens=3))
    steps = driver.run()
    assert [s.num_scheduled_tokens for s in steps] == [{"a": 40}, {"a": 1}, {"a": 1}, {}]
    assert [s.encoder_inputs for s in steps] == [{"a": [0]}, {}, {}, {}]
    assert [s.finished for s in steps] == [set(), set(), set(), {"a"}]
    manager = scheduler.encoder_cache_manager  # its entry stays, unreferenced, for reuse
    assert (manager.num_free_slots, manager.num_freeable_slots) == (64 - 16, 64)
    assert scheduler.requests == {}
