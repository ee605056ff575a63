"""The table of vLLM attributes mmscope wraps, for vLLM 0.32 (tested) and 0.33 (checked against its
sources): one row per target, its wrapper named after what it observes; worker rows name the model
runner whose code they wrap. Supporting another release means editing this table
(docs/vllm-0.33.md: how a release is checked).
"""
from __future__ import annotations

from mmscope import stages
from mmscope.vllm import engine_stats, processor, request_spans as rs
from mmscope.vllm import request_times as rt, runner_output as ro
from mmscope.vllm import scheduler as sch, stat_loggers as sl, step_scopes as sc
from mmscope.vllm import step_telemetry as st, worker_stages as ws
from mmscope.vllm.patching import Hook
from mmscope.vllm.runners import V1, V2

SUPPORTED_VLLM = ">=0.32,<0.34"

SCHED = "vllm.v1.core.sched.scheduler:Scheduler"
ECM = "vllm.v1.core.encoder_cache_manager:EncoderCacheManager"
LOGGERS = "vllm.v1.metrics.loggers"
# The two model runners (vllm/runners.py tells a worker's apart by these classes).
RUNNER_V1 = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
RUNNER_V2 = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"
ENCODER_V2 = "vllm.v1.worker.gpu.mm.encoder_runner:EncoderRunner"


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
             ("self", "scheduler_output", "model_runner_output"), engine_stats.stats_attached,
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
        # vLLM's warm-up and profile runs: their stage durations are no traffic.
        Hook("ranges.warm_up",
             "vllm.multimodal.processing.processor:BaseMultiModalProcessor.get_dummy_mm_inputs",
             ("self", "mm_counts"), processor.dummy_inputs_made, "ranges", "API server"),
        Hook("ranges.ec_connector",
             "vllm.distributed.ec_transfer.ec_connector.factory:ECConnectorFactory.create_connector",
             ("cls", "config", "role"), ws.connector_created, "ranges", "worker"),
    ] + runner_v1_hooks() + runner_v2_hooks()


def runner_v1_hooks() -> list[Hook]:
    """Model Runner V1 (`gpu_model_runner`, the CPU runner's base)."""
    def v1(name, path, params, wrapper, feature):
        return Hook(name, path, params, wrapper, feature, "worker", runner=V1)

    return [
        v1("ranges.vit_forward", f"{RUNNER_V1}.timed_encoder_operation",
           ("self", "should_time", "group_lora_refs", "current_item_idx", "num_items"),
           ws.encoder_forward, "ranges"),
        v1("ranges.gather_mm_embeddings", f"{RUNNER_V1}._gather_mm_embeddings",
           ("self", "scheduler_output", "shift_computed_tokens"), ws.gather_mm_embeddings,
           "ranges"),
        v1("ranges.prepare_mm_inputs", f"{RUNNER_V1}._prepare_mm_inputs", ("self", "num_tokens"),
           ws.prepare_mm_inputs, "ranges"),
        v1("ranges.embed_input_ids.cpu",
           "vllm.v1.worker.cpu_model_runner:CPUModelRunner.load_model", ("self",),
           ws.model_loaded("ranges.embed_input_ids.cpu"), "ranges"),
        v1("ranges.embed_input_ids.gpu", f"{RUNNER_V1}.load_model", ("self",),
           ws.model_loaded("ranges.embed_input_ids.gpu"), "ranges"),
        v1("telemetry.step_shape", f"{RUNNER_V1}._prepare_inputs",
           ("self", "scheduler_output", "num_scheduled_tokens"), st.inputs_prepared, "telemetry"),
        v1("stage_metrics.execute_model", f"{RUNNER_V1}.execute_model",
           ("self", "scheduler_output"), ro.carried("stage_metrics.execute_model"), "metrics"),
        v1("stage_metrics.sample_tokens", f"{RUNNER_V1}.sample_tokens", ("self",),
           ro.carried("stage_metrics.sample_tokens"), "metrics"),
        v1("stage_metrics.async_output",
           "vllm.v1.worker.gpu_model_runner:AsyncGPUModelRunnerOutput.get_output", ("self",),
           ro.carried("stage_metrics.async_output"), "metrics"),
    ]


def runner_v2_hooks() -> list[Hook]:
    """Model Runner V2 (`gpu/model_runner`, the default on GPUs with Triton); it has no
    counterpart of V1's _prepare_mm_inputs, so no prepare stage."""
    def v2(name, path, params, wrapper, feature):
        return Hook(name, path, params, wrapper, feature, "worker", runner=V2)

    return [
        # Its batches are vit_forward: the model's embed_multimodal (wrapped at load_model) or
        # the encoder's CUDA graph, inside a step's timed_encoder_operation.
        v2("ranges.vit_forward.v2", f"{ENCODER_V2}.timed_encoder_operation",
           ("self", "request_ids"), ws.encoder_step, "ranges"),
        v2("ranges.vit_forward.v2.cudagraph",
           "vllm.v1.worker.encoder_cudagraph:EncoderCudaGraphManager.execute",
           ("self", "mm_kwargs"), ws.encoder_batch, "ranges"),
        v2("ranges.gather_mm_embeddings.v2", f"{ENCODER_V2}.gather_mm_embeddings",
           ("self", "req_ids", "total_num_scheduled_tokens", "num_scheduled_tokens",
            "query_start_loc", "prefill_lens", "num_computed_tokens", "draft_lookahead"),
           ws.gather_mm_embeddings_v2, "ranges"),
        v2("ranges.embed_input_ids.v2", f"{RUNNER_V2}.load_model", ("self",),
           ws.model_loaded("ranges.embed_input_ids.v2", ("embed_multimodal",)), "ranges"),
        v2("telemetry.step_shape.v2", f"{RUNNER_V2}.prepare_inputs",
           ("self", "scheduler_output", "batch_req_state", "batch_desc", "num_active_loras"),
           st.batch_prepared, "telemetry"),
        v2("stage_metrics.sample_tokens.v2", f"{RUNNER_V2}.sample_tokens",
           ("self", "grammar_output"), ro.carried("stage_metrics.sample_tokens.v2"), "metrics"),
        v2("stage_metrics.async_output.v2",
           "vllm.v1.worker.gpu.async_utils:AsyncOutput.get_output", ("self",),
           ro.carried("stage_metrics.async_output.v2", stages.MODEL_RUNNER_OUTPUT), "metrics"),
    ]


def vllm_scope_hooks() -> list[Hook]:
    """The step's own ranges (`gpu_model_runner: preprocess/forward/...`, the parents of the
    worker's stages) through mmscope's backends: applied only while mmscope traces. V1 calls the
    name its module imported, so that module's name is wrapped (the scheduler's and the engine's
    scopes, none of them a stage's parent, keep vLLM's own switches); V2 opens none, so they are
    opened at the calls that bound its phases (vllm/step_scopes.py)."""
    def v2(name, path, params, wrapper):
        return Hook(name, path, params, wrapper, "ranges", "worker", runner=V2)

    return [
        Hook("ranges.vllm_scopes.runner",
             "vllm.v1.worker.gpu_model_runner:record_function_or_nullcontext", ("name",),
             sc.vllm_scope, "ranges", "worker", runner=V1),
        v2("ranges.vllm_scopes.v2.step", f"{RUNNER_V2}.execute_model",
           ("self", "scheduler_output", "intermediate_tensors", "dummy_run"), sc.step_executed),
        v2("ranges.vllm_scopes.v2.forward",
           "vllm.v1.worker.gpu.async_utils:StepTimingCollector.forward_start", ("self",),
           sc.forward_started),
        v2("ranges.vllm_scopes.v2.sample", f"{RUNNER_V2}.sample",
           ("self", "hidden_states", "input_batch"), sc.sampled),
        v2("ranges.vllm_scopes.v2.bookkeep", f"{RUNNER_V2}.postprocess_sampled", ("self",),
           sc.bookkept),
    ]


# --- vLLM's OTLP request span (docs/design.md §5a) ------------------------------------------------
OUTPUT = "vllm.v1.engine.output_processor:OutputProcessor"


def otlp_hooks() -> list[Hook]:
    """API server (or the offline LLM's process): vLLM's output processor made with tracing on
    (--otlp-traces-endpoint) applies the rows of otlp_request_hooks(); it is made once, so
    without tracing nothing is applied per request. EngineCore reads the same switch from its
    scheduler's config (scheduler.scheduler_created)."""
    return [
        Hook("otlp.tracing_enabled", f"{OUTPUT}.__init__",
             ("self", "tokenizer", "log_stats", "stream_interval", "tracing_enabled"),
             rs.output_processor_created, "otlp", "API server"),
    ]


def otlp_request_hooks() -> list[Hook]:
    """Applied once vLLM traces requests (request_spans.output_processor_created)."""
    return [
        Hook("otlp.request_added", f"{OUTPUT}.add_request", ("self", "request"),
             rs.request_added, "otlp", "API server"),
        Hook("otlp.request_span", f"{OUTPUT}.do_tracing",
             ("self", "engine_core_output", "req_state", "iteration_stats"), rs.request_traced,
             "otlp", "API server"),
    ]


def all_hooks() -> list[Hook]:
    return accounting_hooks() + metrics_hooks() + range_hooks() + otlp_hooks()
