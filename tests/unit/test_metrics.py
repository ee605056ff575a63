"""The API server's side on vLLM's own StatLoggerManager, built from a real VllmConfig of the
tiny LLaVA (no engine): our series beside vLLM's, fed by the manager hook to every logger."""
from __future__ import annotations

import os

import logging

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mmscope import stages
from mmscope.carry.ledger import Decision, EncoderCacheLedger, Item
from mmscope.vocabulary import HIT_SOURCES as SOURCES
from mmscope.emit.stage_timer import FRONTEND
from mmscope.vllm.api_server import hooks_off
from mmscope.vllm.api_server import stats_line as line_windows
from mmscope.vllm.patching import Status

METRICS_HOOKS = ("prometheus.create", "stat_loggers.record", "log_line.format")


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory):
    from mmscope.demo import environment, tiny_model
    from vllm.engine.arg_utils import EngineArgs

    environment.install()
    model = tiny_model.build(str(tmp_path_factory.mktemp("tiny-llava")))
    with pytest.MonkeyPatch.context() as patch:  # vLLM inspects the model in a subprocess
        patch.setenv("PYTHONPATH", environment.pythonpath(os.environ.get("PYTHONPATH")))
        return EngineArgs(model=model, served_model_name="tiny", enforce_eager=True,
                          max_model_len=512, max_num_seqs=4, max_num_batched_tokens=256,
                          limit_mm_per_prompt={"image": 3}).create_engine_config()


@pytest.fixture(scope="module")
def metrics_hooks(vllm_config):
    """mmscope as vLLM loads it: building the config ran vLLM's load_general_plugins, which
    instruments this process once (register() again is a no-op)."""
    from mmscope.vllm import plugin
    from mmscope.vllm.instrumentor import get_instrumentor

    plugin.register()
    instrumentor = get_instrumentor()
    status = instrumentor.instrument()
    assert {h: status[h] for h in METRICS_HOOKS} == {h: Status.APPLIED for h in METRICS_HOOKS}
    yield
    instrumentor.uninstrument()  # the other unit tests of this process apply their own


def manager(vllm_config, engines=(0,), aggregate=False):
    from vllm.v1.metrics.loggers import StatLoggerManager

    made = StatLoggerManager(vllm_config, list(engines), aggregate_engine_logging=aggregate)
    FRONTEND.drain()  # the series' shape came from vLLM's processor, run on dummy inputs
    return made


def samples(prefix="vllm:encoder_cache") -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
        for s in family.samples:
            if s.name.startswith(prefix) and not s.name.endswith("_created"):
                label = s.labels.get("source") or s.labels.get("modality") or s.labels.get("le")
                out[(s.name, s.labels["engine"], label)] = s.value
    return out


def wire(*decisions) -> dict[str, int]:
    ledger = EncoderCacheLedger()
    for index, decision in decisions:
        ledger.propose(Item("r", index, "image", f"k{index}", 16), decision)
    ledger.commit_step({"r"}, {"r": [i for i, d in decisions if d is Decision.COMPUTE]})
    ledger.occupancy(32, 256)
    return ledger.drain().to_wire()


def stats_with(encoder_cache=None, stage_durations=None):
    from vllm.v1.metrics.stats import SchedulerStats

    stats = SchedulerStats()
    stats.encoder_cache_stats = encoder_cache
    stats.mm_stage_durations = stage_durations
    return stats


def record(mgr, stats, engine_idx=0):
    # as vLLM's output handler calls it: by keyword
    mgr.record(scheduler_stats=stats, iteration_stats=None, mm_cache_stats=None,
               engine_idx=engine_idx)


def test_every_series_is_at_zero_from_the_start_with_the_capacity_set(vllm_config, metrics_hooks):
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.encoder_budget import MultiModalBudget

    manager(vllm_config, engines=(0, 1))
    capacity = MultiModalBudget(vllm_config, MULTIMODAL_REGISTRY,
                                enable_cache=False).encoder_cache_size
    s = samples()
    for engine in ("0", "1"):
        for src in SOURCES:
            assert s[("vllm:encoder_cache_hits_by_source_total", engine, src)] == 0
            assert s[("vllm:encoder_cache_hit_embeds_by_source_total", engine, src)] == 0
        for name in ("queries_by_modality", "hits_by_modality", "prefix_covered_by_modality",
                     "query_embeds_by_modality", "hit_embeds_by_modality"):
            assert s[(f"vllm:encoder_cache_{name}_total", engine, "image")] == 0
        for name in ("queries", "hits", "misses", "deferrals", "evictions", "prefix_covered",
                     "query_embeds", "hit_embeds", "miss_embeds", "prefix_covered_embeds"):
            assert s[(f"vllm:encoder_cache_{name}_total", engine, None)] == 0
        assert s[("vllm:encoder_cache_capacity_embeds", engine, None)] == capacity > 0
        # an embedding of the tiny LLaVA's cache: 64 wide, bfloat16
        assert s[("vllm:encoder_cache_capacity_bytes", engine, None)] == capacity * 64 * 2
    assert not any(label == "video" for _, _, label in s)  # the tiny LLaVA takes images only


def test_the_manager_hook_feeds_every_logger_of_vllms_manager(vllm_config, metrics_hooks):
    from vllm.v1.metrics.loggers import (LoggingStatLogger, PerEngineStatLoggerAdapter,
                                         PrometheusStatLogger)

    mgr = manager(vllm_config, engines=(0, 1))
    adapter = next(x for x in mgr.stat_loggers if isinstance(x, PerEngineStatLoggerAdapter))
    assert any(isinstance(x, PrometheusStatLogger) for x in mgr.stat_loggers)
    per_engine = adapter.per_engine_stat_loggers
    assert all(isinstance(x, LoggingStatLogger) for x in per_engine.values())
    record(mgr, stats_with(wire((0, Decision.COMPUTE), (1, Decision.LOCAL_HIT))), engine_idx=0)
    s = samples()
    assert s[("vllm:encoder_cache_hits_total", "0", None)] == 1
    assert s[("vllm:encoder_cache_misses_total", "0", None)] == 1
    assert s[("vllm:encoder_cache_hits_by_source_total", "0", "local")] == 1
    assert s[("vllm:encoder_cache_usage_embeds", "0", None)] == 32
    assert s[("vllm:encoder_cache_hits_total", "1", None)] == 0
    assert line_windows._windows[per_engine[0]].hits.hit_rate == 0.5
    assert per_engine[1] not in line_windows._windows  # another engine's logger


def test_two_emissions_add_up_and_the_gauges_take_the_last(vllm_config, metrics_hooks):
    mgr = manager(vllm_config)
    record(mgr, stats_with(wire((0, Decision.COMPUTE), (1, Decision.LOCAL_HIT))))
    second = wire((0, Decision.LOCAL_HIT))
    second["usage_embeds"] = 48
    record(mgr, stats_with(second))
    record(mgr, stats_with(None))  # a step without counts changes nothing
    s = samples()
    assert s[("vllm:encoder_cache_queries_total", "0", None)] == 3
    assert s[("vllm:encoder_cache_hits_total", "0", None)] == 2
    assert s[("vllm:encoder_cache_hits_by_source_total", "0", "local")] == 2
    assert s[("vllm:encoder_cache_usage_embeds", "0", None)] == 48
    assert s[("vllm:encoder_cache_usage_bytes", "0", None)] == 48 * 128
    # the same in embeddings: item i of wire() has 16
    assert s[("vllm:encoder_cache_query_embeds_total", "0", None)] == 48
    assert s[("vllm:encoder_cache_hit_embeds_total", "0", None)] == 32
    assert s[("vllm:encoder_cache_miss_embeds_total", "0", None)] == 16
    assert s[("vllm:encoder_cache_hit_embeds_by_modality_total", "0", "image")] == 32


def stats_line(mgr, engine: str = "") -> str:
    """The stats line (of `engine`, "Engine 001", where the manager logs several)."""
    lines = []

    class Recorder(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    target = logging.getLogger("vllm.v1.metrics.loggers")
    handler, level = Recorder(), target.level
    target.addHandler(handler)
    target.setLevel(logging.DEBUG)  # an idle engine's line is a DEBUG line
    try:
        mgr.log()
    finally:
        target.removeHandler(handler)
        target.setLevel(level)
    found = [line for line in lines if "Avg prompt throughput" in line and engine in line]
    assert len(found) == 1, lines
    return found[0]


def test_the_stats_line_gets_the_encoder_hit_rate(vllm_config, metrics_hooks):
    for aggregate in (False, True):
        mgr = manager(vllm_config, aggregate=aggregate)
        record(mgr, stats_with(wire((0, Decision.COMPUTE), (1, Decision.LOCAL_HIT),
                                    (2, Decision.LOCAL_HIT), (3, Decision.LOCAL_HIT))))
        assert stats_line(mgr).endswith(
            ", Encoder cache hit rate: 75.0%, Encoder work saved: 75.0% of embeddings")


def test_the_stats_line_weighs_the_work_saved_by_embeddings(vllm_config, metrics_hooks):
    """One hit on a 4,000-embedding video, one miss on a 64-embedding thumbnail: half the items
    hit, 98.4% of the encoder's work was saved."""
    mgr = manager(vllm_config)
    ledger = EncoderCacheLedger()
    ledger.propose(Item("r", 0, "video", "clip", 4000), Decision.LOCAL_HIT)
    ledger.propose(Item("r", 1, "image", "thumb", 64), Decision.COMPUTE)
    ledger.commit_step({"r"}, {"r": [1]})
    record(mgr, stats_with(ledger.drain().to_wire()))
    assert stats_line(mgr).endswith(
        ", Encoder cache hit rate: 50.0%, Encoder work saved: 98.4% of embeddings")


def test_the_stats_line_gets_the_work_the_prefix_cache_spared(vllm_config, metrics_hooks):
    mgr = manager(vllm_config)
    ledger = EncoderCacheLedger()
    ledger.prefix_covered(Item("r", 0, "image", "k0", 16))
    ledger.propose(Item("r", 1, "image", "k1", 16), Decision.COMPUTE)
    ledger.commit_step({"r"}, {"r": [1]})
    record(mgr, stats_with(ledger.drain().to_wire()))
    assert stats_line(mgr).endswith(", Encoder cache hit rate: 0.0%, Encoder work saved: 50.0% of "
                                    "embeddings, Encoder work avoided: 50.0% of items")
    s = samples()
    assert s[("vllm:encoder_cache_prefix_covered_total", "0", None)] == 1
    assert s[("vllm:encoder_cache_queries_total", "0", None)] == 1


def test_the_stats_line_says_so_whenever_the_prefix_cache_spared_items(vllm_config, metrics_hooks):
    """Prefix-covered items alone (vLLM's CachingMetrics ignores an observation of no requests),
    and beside a hit rate of 100%, whose line the avoided share would otherwise repeat."""
    mgr = manager(vllm_config)
    ledger = EncoderCacheLedger()
    ledger.prefix_covered(Item("r", 0, "image", "k0", 16))
    ledger.commit_step({"r"}, {})
    record(mgr, stats_with(ledger.drain().to_wire()))
    line = stats_line(mgr)
    assert line.endswith(", Encoder work saved: 100.0% of embeddings, Encoder work avoided: "
                         "100.0% of items")
    assert "Encoder cache hit rate" not in line  # no query in the window
    record(mgr, stats_with(wire((1, Decision.LOCAL_HIT))))
    assert stats_line(mgr).endswith(", Encoder cache hit rate: 100.0%, Encoder work saved: 100.0% "
                                    "of embeddings, Encoder work avoided: 100.0% of items")


def test_the_api_servers_media_counts_reach_metrics_and_the_stats_line(vllm_config, metrics_hooks):
    """Two http images fetched though the processor cache held them (0.8 s and 0.4 s), their
    bytes, a failed fetch: on /metrics with the next stats recorded, and on the next stats line
    only (it says what happened since the one before)."""
    from mmscope.carry.media_loads import Item
    from mmscope.vllm.api_server import media_items as media

    mgr = manager(vllm_config)
    for ns in (800_000_000, 400_000_000):
        media.COUNTS.cached("image", "http", ns)
    item = Item("http", "image", 0)
    item.bytes = 1234
    media.COUNTS.loaded(item)
    media.COUNTS.failed(item)  # before its bytes were in hand: a failed fetch
    record(mgr, stats_with(wire((0, Decision.LOCAL_HIT))))
    assert not media.COUNTS.pending
    assert stats_line(mgr).endswith(", Media fetched though cached: 2 items, 1.20 s")
    assert "Media fetched" not in stats_line(mgr)
    s = samples("vllm:mm_media")
    assert s[("vllm:mm_media_redundant_fetches_total", "0", "http")] == 2
    assert s[("vllm:mm_media_redundant_fetch_seconds_total", "0", "http")] == pytest.approx(1.2)
    assert s[("vllm:mm_media_fetched_bytes_total", "0", "http")] == 1234
    assert s[("vllm:mm_media_fetched_bytes_total", "0", "data_url")] == 0  # at 0 from the start
    failed = {(smp.labels["step"], smp.labels["source"]): smp.value
              for family in text_string_to_metric_families(generate_latest(REGISTRY).decode())
              for smp in family.samples if smp.name == "vllm:mm_media_failed_fetches_total"}
    assert failed == {(step, source): float(step == "fetch" and source == "http")
                      for step in ("fetch", "decode") for source in ("http", "data_url", "file")}


def test_the_warm_up_is_no_traffic_for_the_stage_histogram(vllm_config, metrics_hooks):
    """vLLM's warm-up and profile runs hash and process dummy items for no request
    (BaseMultiModalProcessor.get_dummy_mm_inputs): no stage durations; a real input has them."""
    from vllm.multimodal import MULTIMODAL_REGISTRY

    from tests.kit.engine import image

    processor = MULTIMODAL_REGISTRY.create_processor(vllm_config.model_config)
    FRONTEND.drain()
    processor.get_dummy_mm_inputs({"image": 2})
    assert not FRONTEND.pending
    processor("<s>user: <image>What is this?\nassistant:",
              processor.info.parse_mm_data({"image": image(1)}))
    timed = FRONTEND.drain()
    assert len(timed[stages.hash_range("pil_image")]) == 1
    assert len(timed[stages.processor_range("apply_hf_processor")]) == 1


def test_stage_durations_of_both_processes_reach_the_histogram(vllm_config, metrics_hooks):
    mgr = manager(vllm_config)
    FRONTEND.record("mm:hash:pil_image", 4_000)  # timed in this (the API server's) process
    record(mgr, stats_with(None, {"gpu_model_runner: vit_forward": [2_000_000, 3_000_000]}))
    counts = {}
    for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
        for smp in family.samples:
            if smp.name == "vllm:mm_stage_duration_seconds_count":
                counts[smp.labels["stage"]] = smp.value
    # every timed stage is there from the start (at 0), the media stages of the model's
    # modalities too; the two fed count their durations
    assert counts == {**{stage: 0 for stage in stages.TIMED_STAGES + stages.media_stages(["image"])},
                      "mm:hash:pil_image": 1, "gpu_model_runner: vit_forward": 2}
    assert not FRONTEND.pending


TTFT_HOOKS = ("request_times.assigned", "request_times.finished")


@pytest.mark.parametrize("switch", ["", "1"])
def test_the_ttft_split_is_applied_and_exposed_only_with_its_switch(vllm_config, metrics_hooks,
                                                                   monkeypatch, switch):
    """MMSCOPE_TTFT_PARTS=1 applies the two API-server hooks and makes the split's series at 0;
    without it neither, and doctor's status says how to turn it on."""
    from mmscope.vllm.api_server import request_times
    from mmscope.vllm.instrumentor import get_instrumentor

    monkeypatch.setenv("MMSCOPE_TTFT_PARTS", switch)
    instrumentor = get_instrumentor()
    instrumentor.uninstrument()
    try:
        status = instrumentor.instrument()
        manager(vllm_config)
        series = samples("vllm:request_")
        parts = {k for k in series if k[0].startswith("vllm:request_ttft_part_seconds")}
        if switch:
            assert {status[h] for h in TTFT_HOOKS} == {Status.APPLIED}
            assert parts and all(series[k] == 0 for k in parts)
            assert len(request_times.HISTOGRAMS) == 1
        else:
            assert {status[h] for h in TTFT_HOOKS} == {"skipped: MMSCOPE_TTFT_PARTS=1 turns it on"}
            assert not parts and request_times.HISTOGRAMS == []
    finally:
        monkeypatch.delenv("MMSCOPE_TTFT_PARTS")
        instrumentor.uninstrument()
        instrumentor.instrument()


def hook_off_samples() -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
        for s in family.samples:
            if s.name == "vllm:mmscope_hook_off":
                out[(s.labels["engine"], s.labels["hook"])] = s.value
    return out


@pytest.fixture
def no_hooks_off():
    yield
    hooks_off.OFF.clear()


def test_a_hook_turned_off_in_an_engine_is_said_and_its_counts_withdrawn(
        vllm_config, metrics_hooks, no_hooks_off):
    """EngineCore's news of a dead accounting hook: vllm:mmscope_hook_off says which, that
    engine's encoder-cache series go (not zeros) and stay gone, its stats line says why; the
    other engine counts on."""
    mgr = manager(vllm_config, engines=(0, 1))
    off = hook_off_samples()
    assert off[("0", "scheduler.commit")] == 0 and len(off) >= 2 * 25  # every row, at 0
    record(mgr, stats_with(wire((0, Decision.COMPUTE))), engine_idx=0)
    news = stats_with()
    news.mm_hooks_off = {"scheduler.commit": "after error: AttributeError: boom"}
    record(mgr, news, engine_idx=0)
    record(mgr, stats_with(wire((0, Decision.LOCAL_HIT))), engine_idx=0)  # no comeback
    record(mgr, stats_with(wire((0, Decision.LOCAL_HIT))), engine_idx=1)
    off = hook_off_samples()
    assert {k: v for k, v in off.items() if v} == {("0", "scheduler.commit"): 1.0}
    engines = {engine for (_, engine, _) in samples()}
    assert engines == {"1"}  # engine 0's encoder-cache series are withdrawn
    assert samples()[("vllm:encoder_cache_hits_total", "1", None)] == 1
    assert stats_line(mgr, "Engine 000").endswith(
        ", Encoder cache figures: off (mmscope hook scheduler.commit turned itself off after "
        "error: AttributeError: boom)")
    assert stats_line(mgr, "Engine 001").endswith(", Encoder cache hit rate: 100.0%, "
                                                  "Encoder work saved: 100.0% of embeddings")


def test_a_hook_of_this_process_turned_off_is_said_at_once(vllm_config, metrics_hooks,
                                                           no_hooks_off):
    """A hook of the API server's own process: reported when it turns off, for every engine,
    even when the recording hook is the one that died."""
    from mmscope.vllm import targets
    from mmscope.vllm.patching import TURNED_OFF

    mgr = manager(vllm_config, engines=(0, 1))  # noqa: F841 - alive, as vLLM keeps it
    hook = targets.TABLE.by_name["ranges.hash"]
    assert hook.status is Status.APPLIED
    try:
        hook.failed(RuntimeError("ours"))
        off = hook_off_samples()
        assert {k for k, v in off.items() if v} == {("0", "ranges.hash"), ("1", "ranges.hash")}
        stages_left = [k for k in samples("vllm:mm_stage_duration_seconds")]
        assert stages_left == []  # the stage histogram it fed is withdrawn
    finally:
        hook.apply()
        TURNED_OFF.all.pop(hook.name, None), TURNED_OFF.drain()
