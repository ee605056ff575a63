"""The table of vLLM attributes mmscope wraps, for vLLM 0.32.x.

Supporting another vLLM release means editing this table; wrappers and metrics stay as they are.
"""
from __future__ import annotations

from mmscope import stages
from mmscope.vllm import scheduler as ec
from mmscope.vllm import ranges as rg
from mmscope.vllm import stat_loggers as sl
from mmscope.vllm.patching import (RESULT, Hook, all_clear, any_set, every, falsy, observe_after,
                                   observe_around, observe_before, param, truthy)

SUPPORTED_VLLM = ">=0.32,<0.33"

SCHED = "vllm.v1.core.sched.scheduler:Scheduler"
ECM = "vllm.v1.core.encoder_cache_manager:EncoderCacheManager"
LOGGERS = "vllm.v1.metrics.loggers"
RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"


def accounting_hooks() -> list[Hook]:
    """EngineCore: the scheduler's encoder decisions (DESIGN §4)."""
    return [
        Hook("encoder_cache.local_hit", f"{ECM}.check_and_update_cache",
             ("self", "request", "input_id"),
             observe_after(ec.saw_cache_check, when=(truthy(RESULT),)),  # resident
             "accounting", "EngineCore"),
        Hook("encoder_cache.deferral", f"{ECM}.can_allocate",
             ("self", "request", "input_id", "encoder_compute_budget"),
             observe_after(ec.saw_can_allocate, when=(falsy(RESULT),)),  # no room or budget
             "accounting", "EngineCore"),
        Hook("encoder_cache.free", f"{ECM}.free", ("self", "request"),
             observe_before(ec.saw_free), "accounting", "EngineCore"),
        Hook("scheduler.allocate", f"{SCHED}._allocate_encoder_inputs",
             ("self", "request", "input_ids", "duplicate_input_ids"),
             observe_before(ec.saw_allocation), "accounting", "EngineCore"),
        Hook("scheduler.commit", f"{SCHED}.schedule", ("self",),
             observe_after(ec.saw_schedule, when=(
                 any_set(RESULT, "scheduled_encoder_inputs", "free_encoder_mm_hashes"),
                 # items looked at this step (hits, deferrals): the ledger's pending proposals
                 any_set(0, ec.PROPOSALS, via="encoder_cache_manager"))),
             "accounting", "EngineCore"),
        Hook("scheduler.created", f"{SCHED}.__init__",
             ("self", "vllm_config", "kv_cache_config"), observe_after(ec.scheduler_created),
             "metrics", "EngineCore"),
        Hook("scheduler.emit_stats", f"{SCHED}.update_from_output",
             ("self", "scheduler_output", "model_runner_output"),
             observe_after(ec.attach_stats, when=(
                 every(ec.SEND_EVERY_S),
                 all_clear(0, "running", "waiting", "kv_holding_waiting"),  # ran dry
                 any_set(2, "_mmscope_stage_durations"))),  # a worker process' durations
             "accounting", "EngineCore"),
    ]


def metrics_hooks() -> list[Hook]:
    """API server (or the offline LLM's process): Prometheus series and the stats line."""
    record = ("self", "scheduler_stats", "iteration_stats", "mm_cache_stats", "engine_idx")
    return [
        Hook("prometheus.create", f"{LOGGERS}:PrometheusStatLogger.__init__",
             ("self", "vllm_config", "engine_indexes"), observe_after(sl.prom_created),
             "metrics", "API server"),
        # One hook for every logger, on the manager; vLLM passes the stats by keyword there.
        Hook("stat_loggers.record", f"{LOGGERS}:StatLoggerManager.record", record,
             observe_after(sl.stats_recorded, when=(any_set(
                 param(1, "scheduler_stats"), "encoder_cache_stats", "mm_stage_durations"),)),
             "metrics", "API server"),
        Hook("log_line.format", f"{LOGGERS}:LoggingStatLogger.log", ("self",),
             observe_around(sl.log_begin, sl.log_end), "metrics", "API server"),
    ]


def range_hooks() -> list[Hook]:
    """API server and worker: the stage ranges of DESIGN §3, step telemetry, stage timings."""
    return [
        Hook("ranges.hash", "vllm.multimodal.hasher:MultiModalHasher.hash_kwargs",
             ("cls", "algorithm"), rg.hash_kwargs_ranged, "ranges", "API server"),
        # With `enabled` false, 0.32's record() only yields; the stage timer then stands in for it
        # (ranges.processor_stage_ranged): check that on the next release.
        Hook("ranges.processor_stages", "vllm.multimodal.processing.context:TimingContext.record",
             ("self", "stage"), rg.processor_stage_ranged, "ranges", "API server"),
        Hook("ranges.vit_forward", f"{RUNNER}.timed_encoder_operation",
             ("self", "should_time", "group_lora_refs", "current_item_idx", "num_items"),
             rg.encoder_forward_ranged, "ranges", "worker"),
        Hook("ranges.gather_mm_embeddings", f"{RUNNER}._gather_mm_embeddings",
             ("self", "scheduler_output"), rg.ranged_method(stages.GATHER_MM_EMBEDDINGS),
             "ranges", "worker"),
        Hook("ranges.prepare_mm_inputs", f"{RUNNER}._prepare_mm_inputs",
             ("self", "num_tokens"), rg.ranged_method(stages.PREPARE_MM_INPUTS),
             "ranges", "worker"),
        Hook("ranges.embed_input_ids.cpu",
             "vllm.v1.worker.cpu_model_runner:CPUModelRunner.load_model", ("self",),
             observe_after(rg.model_loaded), "ranges", "worker"),
        Hook("ranges.embed_input_ids.gpu", f"{RUNNER}.load_model", ("self",),
             observe_after(rg.model_loaded), "ranges", "worker"),
        Hook("ranges.ec_connector",
             "vllm.distributed.ec_transfer.ec_connector.factory:ECConnectorFactory.create_connector",
             ("cls", "config", "role"), observe_after(rg.connector_created), "ranges", "worker"),
        Hook("telemetry.step_shape", f"{RUNNER}._prepare_inputs",
             ("self", "scheduler_output", "num_scheduled_tokens"),
             observe_before(rg.step_observer()), "telemetry", "worker"),
        Hook("stage_metrics.execute_model", f"{RUNNER}.execute_model",
             ("self", "scheduler_output"), rg.worker_timings_attached, "metrics", "worker"),
        Hook("stage_metrics.sample_tokens", f"{RUNNER}.sample_tokens", ("self",),
             rg.worker_timings_attached, "metrics", "worker"),
    ]


def all_hooks() -> list[Hook]:
    return accounting_hooks() + metrics_hooks() + range_hooks()
