"""The time-to-first-token split without an engine: shares that add up to each step, the join in
either order, and pending records bounded."""
from __future__ import annotations

from mmscope import stages
from mmscope.carry import ttft_split


def test_a_step_is_shared_by_embeddings_and_adds_up_exactly():
    shares = ttft_split.EngineShares()
    for r in ("a", "b", "c"):
        shares.admit(r)
    shares.share(ttft_split.ENCODER, 1_000_003, {"a": 1, "b": 1, "c": 2})
    encoder = {r: rec[ttft_split.ENCODER] for r, rec in shares.open.items()}
    assert sum(encoder.values()) == 1_000_003
    assert encoder["a"] == encoder["b"] == 250_000 and encoder["c"] == 500_003


def test_only_open_requests_take_a_share_and_close_after_the_first_token():
    shares = ttft_split.EngineShares()
    shares.admit("a")
    shares.share(ttft_split.EC_LOAD, 900, {"a": 3, "gone": 6})
    assert shares.open["a"][ttft_split.EC_LOAD] == 300
    shares.computed("a", 2)
    shares.close(lambda r: False)
    assert shares.drain() == {}
    shares.close(lambda r: r == "a")
    assert shares.drain() == {"a": {ttft_split.ENCODER: 0, ttft_split.EC_LOAD: 300, ttft_split.COMPUTED: 2}}
    assert not shares.open


def record(encoder_ns, ec_load_ns, computed):
    return {ttft_split.ENCODER: encoder_ns, ttft_split.EC_LOAD: ec_load_ns, ttft_split.COMPUTED: computed}


def front(ttft_s=1.0, queue=0.1, prefill=0.6):
    return ttft_split.FrontTimes("chatcmpl-1", ttft_s, queue, prefill)


def test_the_parts_add_up_whichever_half_comes_last():
    for engine_first in (True, False):
        join = ttft_split.TtftJoin()
        join.assigned("r-1", ttft_split.ApiTimes(0.2, media_s=0.15, processor_s=0.03))
        if engine_first:
            join.engine_shares({"r-1": record(300_000_000, 50_000_000, 1)}, 1)
            assert not join.ready
            join.finished("r-1", front())
        else:
            join.finished("r-1", front())
            assert not join.ready
            join.engine_shares({"r-1": record(300_000_000, 50_000_000, 1)}, 1)
        (split,) = join.drain()
        assert (split.request_id, split.engine, split.hit) == ("chatcmpl-1", 1, False)
        assert split.internal_id == "r-1"
        p = split.parts
        assert tuple(p) == stages.TTFT_PARTS
        assert (p["media"], p["processor"], p["queue"], p["encoder"], p["ec_load"]) == (
            0.15, 0.03, 0.1, 0.3, 0.05)
        assert abs(p["render"] - 0.02) < 1e-12  # the rest of the API server's 0.2 s
        assert abs(p["prefill"] - 0.25) < 1e-12 and abs(p["other"] - 0.1) < 1e-12
        assert abs(sum(p.values()) - split.ttft_s) < 1e-12
        assert not (join.api or join.front or join.engine)


def test_a_request_whose_encoder_never_ran_is_a_hit_and_text_only_requests_are_ignored():
    join = ttft_split.TtftJoin()
    join.assigned("r-1", ttft_split.ApiTimes(0.01))
    join.finished("text-only", front())
    join.finished("r-1", front())
    join.engine_shares({"r-1": record(0, 0, 0)}, 0)
    (split,) = join.drain()
    assert split.hit and split.parts["encoder"] == 0.0
    assert not join.front


def test_pending_halves_are_bounded_and_records_of_requests_not_split_are_dropped(monkeypatch):
    monkeypatch.setattr(ttft_split, "MAX_PENDING", 3)
    join = ttft_split.TtftJoin()
    for i in range(10):
        join.assigned(f"r-{i}", ttft_split.ApiTimes(0.0))
        # a record for vLLM's request span alone (its request's start was not seen) is dropped
        join.engine_shares({f"r-{i}": record(0, 0, 0), f"unseen-{i}": record(0, 0, 0)}, 0)
    assert list(join.api) == list(join.engine) == ["r-7", "r-8", "r-9"]


def test_probe_line_names_every_part():
    join = ttft_split.TtftJoin()
    join.assigned("r", ttft_split.ApiTimes(0.5))
    join.finished("r", front())
    join.engine_shares({"r": record(0, 0, 0)}, 0)
    line = ttft_split.probe_line(join.drain()[0])
    assert line.startswith("mm_ttft_probe req=chatcmpl-1 encoder_cache=hit ttft=1.000000 ")
    assert all(f" {p}=" in line for p in stages.TTFT_PARTS)
