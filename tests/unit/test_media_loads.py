"""The media before the processor without an engine: sources, the wall time of items loaded at
once, the processor cache's answers matched to a render's items, what each count says, renders
handed on by arrival time, and the Chrome lanes of ranges that overlap."""
from __future__ import annotations

import json

import pytest

from mmscope.carry import media_loads
from mmscope.emit.chrome import LANE_TID_BASE, ChromeTraceWriter, read_events


@pytest.mark.parametrize("url,source", [
    ("data:image/png;base64,AAAA", "data_url"), ("DATA:image/png;base64,AA", "data_url"),
    ("http://127.0.0.1:8/a.png", "http"), ("https://example.org/a.png", "http"),
    ("file:///tmp/a.png", "file"), ("ftp://host/a.png", None), ("a.png", None)])
def test_a_urls_source_is_vllms_own_reading(url, source):
    assert media_loads.source_of(url) == source


def test_items_loaded_at_once_count_once_in_the_wall_time():
    assert media_loads.wall_ns([]) == 0
    assert media_loads.wall_ns([(0, 10), (20, 25)]) == 15  # one after the other
    assert media_loads.wall_ns([(0, 10), (5, 12), (2, 3)]) == 12  # overlapping and nested
    assert media_loads.wall_ns([(20, 30), (0, 10), (10, 20)]) == 30  # touching, in any order


def loaded(render: media_loads.Render, *items) -> None:
    for source, modality, start, end in items:
        render.item_loaded(media_loads.Item(source, modality, start), end)


def test_the_processor_caches_answers_name_the_fetches_it_made_pointless():
    """Per modality in order: the second image and the audio were in the cache."""
    render, counts = media_loads.Render(), media_loads.MediaCounts()
    loaded(render, ("http", "image", 0, 800), ("data_url", "image", 0, 5),
           ("http", "audio", 10, 40))
    media_loads.match_cached(render, {"image": ["a", "b"], "audio": ["c"]},
                       {"image": [False, True], "audio": [True]}, counts)
    assert counts.drain() == {"cached:data_url:image": 1, "cached_ns:data_url:image": 5,
                              "cached:http:audio": 1, "cached_ns:http:audio": 30}
    assert render.media_s() == 800 / 1e9 and not any(render.loaded.values())


def test_a_prompt_with_items_that_came_as_objects_is_left_out():
    """Three image hashes, two image URLs loaded: which is which cannot be told."""
    render, counts = media_loads.Render(), media_loads.MediaCounts()
    loaded(render, ("http", "image", 0, 800), ("http", "image", 0, 800))
    media_loads.match_cached(render, {"image": ["a", "b", "c"]}, {"image": [True, True, True]}, counts)
    assert not counts.pending


def test_a_failed_load_says_its_step():
    counts, item = media_loads.MediaCounts(), media_loads.Item("http", "image", 0)
    counts.failed(item)  # no bytes in hand: refused, an HTTP error
    item.fetched_ns = 5
    counts.failed(item)  # bytes that were no image
    assert counts.drain() == {"failed:fetch:http:image": 1, "failed:decode:http:image": 1}


def test_lookups_are_taken_once_by_the_hashes_object():
    lookups, hashes = media_loads.Lookups(), {"image": ["a"]}
    lookups.looked_up(hashes, {"image": [True]})
    assert lookups.take({"image": ["a"]}) is None  # an equal dict is another prompt's
    assert lookups.take(hashes) == {"image": [True]} and lookups.take(hashes) is None


def test_a_renders_requests_take_it_by_arrival_time():
    from mmscope.vllm.api_server.media_items import Renders

    renders, render = Renders(), media_loads.Render()
    renders.add(1.5, render)
    renders.add(1.5, render)  # a batch rendered at once: two requests, one arrival time
    assert renders.take(1.5) is render and renders.take(1.5) is render
    assert renders.take(1.5) is None and not renders.by_arrival


def test_ranges_that_overlap_take_lanes_of_their_own(tmp_path):
    writer = ChromeTraceWriter(str(tmp_path / "t.trace.json"))
    writer.complete_on_lane("a", 0, 10_000)
    writer.complete_on_lane("b", 5_000, 20_000)  # overlaps a: a second lane
    writer.complete_on_lane("c", 12_000, 15_000)  # a has ended: the first lane again
    writer.close()
    events = read_events((tmp_path / "t.trace.json").read_text())
    lanes = {e["name"]: e["tid"] - LANE_TID_BASE for e in events if e["ph"] == "X"}
    assert lanes == {"a": 0, "b": 1, "c": 0}
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert names == {LANE_TID_BASE: "mmscope lane 0", LANE_TID_BASE + 1: "mmscope lane 1"}
    assert json.loads((tmp_path / "t.trace.json").read_text())  # still strict JSON


def test_the_render_rows_apply_once_an_item_comes_by_url():
    """Without the TTFT split, a process given only objects (the offline LLM's PIL images)
    never applies the render and processor rows; the first item by URL applies them, and its
    fetch and decode are timed and counted, through vLLM's own MediaConnector."""
    import base64
    import io

    from vllm.multimodal.media.connector import MediaConnector

    from mmscope import stages
    from mmscope.demo.inputs import image
    from mmscope.emit.stage_timer import FRONTEND
    from mmscope.vllm import targets
    from mmscope.vllm.api_server import media_items as adapter
    from mmscope.vllm.patching import Status, When

    rows = [r for r in targets.TABLE if r.name.startswith("media.")]
    later = [r for r in rows if r.when is When.MEDIA]
    buf = io.BytesIO()
    image(1).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    try:
        for row in rows:
            row.revert()
            if row.when is When.START:
                row.apply()
        assert later and {r.status for r in later} == {Status.NOT_APPLIED}
        FRONTEND.drain(), adapter.COUNTS.drain()
        assert MediaConnector().fetch_image(url).size == (32, 32)
        assert {r.status for r in later} == {Status.APPLIED}
        timed = FRONTEND.drain()
        assert [len(timed[stages.media_range(step, "data_url", "image")])
                for step in ("fetch", "decode")] == [1, 1]
        assert adapter.COUNTS.drain() == {"bytes:data_url:image": len(buf.getvalue())}
    finally:
        for row in rows:
            row.revert()
