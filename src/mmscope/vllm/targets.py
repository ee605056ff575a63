"""The table of vLLM attributes mmscope wraps, for vLLM 0.32 (tested) and 0.33 (checked against its
sources): one row per target, its wrapper named after what it observes. Supporting another
release means editing this table (docs/vllm-0.33.md: how a release is checked).
"""
from __future__ import annotations

from mmscope import stages
from mmscope.vllm import processor, request_times as rt, scheduler as sch, stat_loggers as sl
from mmscope.vllm import worker as wk
from mmscope.vllm.patching import Hook

SUPPORTED_VLLM = ">=0.32,<0.34"

SCHED = "vllm.v1.core.sched.scheduler:Scheduler"
ECM = "vllm.v1.core.encoder_cache_manager:EncoderCacheManager"
LOGGERS = "vllm.v1.metrics.loggers"
RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"


def accounting_hooks() -> list[Hook]:
    """EngineCore: the scheduler's encoder decisions (docs/design.md §4)."""
    return [
        Hook("encoder_cache.local_hit", f"{ECM}.check_and_update_cache",
             ("self", "request", "input_id"), sch.cache_checked, "accounting", "EngineCore"),
        Hook("encoder_cache.deferral", f"{ECM}.can_allocate",
             ("self", "request", "input_id", "encoder_compute_budget"), sch.allocation_checked,
             "accounting", "EngineCore"),
        Hook("encoder_cache.free", f"{ECM}.free", ("self", "request"), sch.entries_freed,
             "accounting", "EngineCore"),
        Hook("scheduler.allocate", f"{SCHED}._allocate_encoder_inputs",
             ("self", "request", "input_ids", "duplicate_input_ids"), sch.inputs_allocated,
             "accounting", "EngineCore"),
        Hook("scheduler.commit", f"{SCHED}.schedule", ("self",), sch.step_scheduled,
             "accounting", "EngineCore"),
        Hook("scheduler.created", f"{SCHED}.__init__", ("self", "vllm_config", "kv_cache_config"),
             sch.scheduler_created, "metrics", "EngineCore"),
        Hook("scheduler.emit_stats", f"{SCHED}.update_from_output",
             ("self", "scheduler_output", "model_runner_output"), sch.stats_attached,
             "accounting", "EngineCore"),
    ]


def metrics_hooks() -> list[Hook]:
    """API server (or the offline LLM's process): Prometheus series and the stats line."""
    return [
        Hook("prometheus.create", f"{LOGGERS}:PrometheusStatLogger.__init__",
             ("self", "vllm_config", "engine_indexes"), sl.prometheus_created,
             "metrics", "API server"),
        Hook("stat_loggers.record", f"{LOGGERS}:StatLoggerManager.record",
             ("self", "scheduler_stats", "iteration_stats", "mm_cache_stats", "engine_idx"),
             sl.stats_recorded, "metrics", "API server"),
        Hook("log_line.format", f"{LOGGERS}:LoggingStatLogger.log", ("self",), sl.stats_logged,
             "metrics", "API server"),
        # Each multimodal request's time to first token by part (docs/design.md §4a): only
        # with MMSCOPE_TTFT_PARTS=1 (the instrumentor leaves feature ttft_parts out otherwise).
        Hook("request_times.assigned",
             "vllm.v1.engine.input_processor:InputProcessor.assign_request_id", ("request",),
             rt.request_id_assigned, "ttft_parts", "API server"),
        Hook("request_times.finished",
             "vllm.v1.engine.output_processor:OutputProcessor._update_stats_from_finished",
             ("self", "req_state", "finish_reason", "iteration_stats"), rt.request_finished,
             "ttft_parts", "API server"),
    ]


def range_hooks() -> list[Hook]:
    """API server and worker: the stage ranges of docs/design.md §3, step telemetry, stage timings."""
    return [
        Hook("ranges.hash", "vllm.multimodal.hasher:MultiModalHasher.hash_kwargs",
             ("cls", "algorithm"), processor.item_hashed, "ranges", "API server"),
        # With `enabled` false, record() only yields (0.32 and 0.33 alike); the stage timer then
        # stands in for it (processor.processor_stage): check that premise on the next release.
        Hook("ranges.processor_stages", "vllm.multimodal.processing.context:TimingContext.record",
             ("self", "stage"), processor.processor_stage, "ranges", "API server"),
        Hook("ranges.vit_forward", f"{RUNNER}.timed_encoder_operation",
             ("self", "should_time", "group_lora_refs", "current_item_idx", "num_items"),
             wk.encoder_forward, "ranges", "worker"),
        Hook("ranges.gather_mm_embeddings", f"{RUNNER}._gather_mm_embeddings",
             ("self", "scheduler_output"), wk.gather_mm_embeddings, "ranges", "worker"),
        Hook("ranges.prepare_mm_inputs", f"{RUNNER}._prepare_mm_inputs", ("self", "num_tokens"),
             wk.prepare_mm_inputs, "ranges", "worker"),
        Hook("ranges.embed_input_ids.cpu",
             "vllm.v1.worker.cpu_model_runner:CPUModelRunner.load_model", ("self",),
             wk.model_loaded("ranges.embed_input_ids.cpu"), "ranges", "worker"),
        Hook("ranges.embed_input_ids.gpu", f"{RUNNER}.load_model", ("self",),
             wk.model_loaded("ranges.embed_input_ids.gpu"), "ranges", "worker"),
        Hook("ranges.ec_connector",
             "vllm.distributed.ec_transfer.ec_connector.factory:ECConnectorFactory.create_connector",
             ("cls", "config", "role"), wk.connector_created, "ranges", "worker"),
        Hook("telemetry.step_shape", f"{RUNNER}._prepare_inputs",
             ("self", "scheduler_output", "num_scheduled_tokens"), wk.inputs_prepared,
             "telemetry", "worker"),
        Hook("stage_metrics.execute_model", f"{RUNNER}.execute_model", ("self", "scheduler_output"),
             wk.durations_sent("stage_metrics.execute_model"), "metrics", "worker"),
        Hook("stage_metrics.sample_tokens", f"{RUNNER}.sample_tokens", ("self",),
             wk.durations_sent("stage_metrics.sample_tokens"), "metrics", "worker"),
    ]


def vllm_scope_hooks() -> list[Hook]:
    """The model runner's own step ranges (`gpu_model_runner: preprocess/forward/...`, the parents
    of the worker's stages) through mmscope's backends: applied only while mmscope traces. The
    module calls the name it imported, so that module's name is wrapped. The scheduler's and the
    engine's scopes (about two thirds of vLLM's, none of them a stage's parent) keep vLLM's own
    switches."""
    return [Hook("ranges.vllm_scopes.runner",
                 "vllm.v1.worker.gpu_model_runner:record_function_or_nullcontext", ("name",),
                 wk.vllm_scope, "ranges", "worker")]


def all_hooks() -> list[Hook]:
    return accounting_hooks() + metrics_hooks() + range_hooks()
