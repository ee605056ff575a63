"""The table of vLLM attributes mmscope wraps, grouped by the process they run in: one row per
target, its wrapper named after what it observes, the parameters the wrapper receives by name,
the model runner and the vLLM releases it exists in. Supporting another release means editing
this table (docs/vllm-0.34.md: how a release is checked).
"""
from __future__ import annotations

from mmscope import stages
from mmscope.carry import ttft_split
from mmscope.vllm.api_server import media_items as media, processor, request_spans as rs
from mmscope.vllm.api_server import request_times as rt, stat_loggers as sl, stats_line
from mmscope.vllm.engine_core import handoff, scheduler as sch
from mmscope.vllm.worker import outputs, preprocess_stages as ws, step_scopes as sc
from mmscope.vllm.worker import step_telemetry as st
from mmscope.vllm.patching import Hook, Table, When
from mmscope.vllm.runners import RUNNER_STANDALONE, RUNNER_V1, RUNNER_V2, V1, V2, V2_STANDALONE
from mmscope.vocabulary import Feature, Process

ACCOUNTING, METRICS, RANGES, TELEMETRY = (Feature.ACCOUNTING, Feature.METRICS, Feature.RANGES,
                                          Feature.TELEMETRY)
TTFT_PARTS, OTLP = Feature.TTFT_PARTS, Feature.OTLP

SCHED = "vllm.v1.core.sched.scheduler:Scheduler"
ECM = "vllm.v1.core.encoder_cache_manager:EncoderCacheManager"
LOGGERS = "vllm.v1.metrics.loggers"
OUTPUT = "vllm.v1.engine.output_processor:OutputProcessor"
ENCODER_V2 = "vllm.v1.worker.gpu.mm.encoder_runner:EncoderRunner"
ENCODER_STANDALONE = "vllm.v1.worker.cpu.encoder_runner:EncoderRunner"
KV_STANDALONE = "vllm.v1.worker.cpu.kv_connector"
MEDIA = "vllm.multimodal.media"
RENDERER = "vllm.renderers.base:BaseRenderer"
V1_RELEASES = "<0.34"  # vLLM 0.34 removed Model Runner V1
STANDALONE_RELEASES = ">=0.34"  # and added a V2 runner of its own for CPUs without Triton


def engine_core(name, path, params, wrapper, feature=ACCOUNTING) -> Hook:
    return Hook(name, path, params, wrapper, feature, Process.ENGINE_CORE)


# EngineCore: the scheduler's encoder decisions (docs/design.md §4) and what its stats carry.
ENGINE_CORE_ROWS = [
    engine_core("encoder_cache.local_hit", f"{ECM}.check_and_update_cache",
                ("request", "input_id"), sch.cache_checked),
    engine_core("encoder_cache.deferral", f"{ECM}.can_allocate", ("request", "input_id"),
                sch.allocation_checked),
    engine_core("encoder_cache.free", f"{ECM}.free", ("request",), sch.entries_freed),
    engine_core("scheduler.allocate", f"{SCHED}._allocate_encoder_inputs",
                ("request", "input_ids", "duplicate_input_ids"), sch.inputs_allocated),
    engine_core("scheduler.commit", f"{SCHED}.schedule", (), sch.step_scheduled),
    engine_core("scheduler.created", f"{SCHED}.__init__", (), sch.scheduler_created, METRICS),
    engine_core("scheduler.emit_stats", f"{SCHED}.update_from_output",
                ("scheduler_output", "model_runner_output"), handoff.stats_attached),
]


def api_server(name, path, params, wrapper, feature, when=When.START) -> Hook:
    return Hook(name, path, params, wrapper, feature, Process.API_SERVER, when=when)


# API server (or the offline LLM's process): Prometheus series, the stats line, the mm:* ranges,
# each multimodal request's TTFT by part (only with MMSCOPE_TTFT_PARTS=1) and vLLM's OTLP span.
API_SERVER_ROWS = [
    api_server("prometheus.create", f"{LOGGERS}:PrometheusStatLogger.__init__", (),
               sl.prometheus_created, METRICS),
    api_server("stat_loggers.record", f"{LOGGERS}:StatLoggerManager.record",
               ("scheduler_stats", "engine_idx"), sl.stats_recorded, METRICS),
    api_server("log_line.format", f"{LOGGERS}:LoggingStatLogger.log", (), stats_line.stats_logged,
               METRICS),
    api_server("request_times.assigned",
               "vllm.v1.engine.input_processor:InputProcessor.assign_request_id", ("request",),
               rt.request_id_assigned, TTFT_PARTS),
    api_server("request_times.finished", f"{OUTPUT}._update_stats_from_finished", ("req_state",),
               rt.request_finished, TTFT_PARTS),
    api_server("ranges.hash", "vllm.multimodal.hasher:MultiModalHasher.hash_kwargs", ("kwargs",),
               processor.item_hashed, RANGES),
    # With `enabled` false, record() only yields (0.32 to 0.34 alike); the stage timer then
    # stands in for it (processor.processor_stage): check that premise on the next release.
    api_server("ranges.processor_stages", "vllm.multimodal.processing.context:TimingContext.record",
               ("stage",), processor.processor_stage, RANGES),
    # vLLM's warm-up and profile runs: their stage durations are no traffic.
    api_server("ranges.warm_up",
               "vllm.multimodal.processing.processor:BaseMultiModalProcessor.get_dummy_mm_inputs",
               (), processor.dummy_inputs_made, RANGES),
    # Media before the processor (api_server/media_items.py): each item's fetch, then its decode by the media
    # IO vLLM made for it; each chat render's items and processing, for the TTFT split and the
    # fetches the processor cache made pointless: those rows apply once an item comes by URL
    # (or at start with the split on), so a process given only objects (the offline LLM's PIL
    # images) pays nothing for them.
    api_server("media.load", f"{MEDIA}.connector:MediaConnector.load_from_url",
               ("url", "media_io"), media.item_loaded, RANGES),
    api_server("media.load_async", f"{MEDIA}.connector:MediaConnector.load_from_url_async",
               ("url", "media_io"), media.item_loaded_async, RANGES),
    api_server("media.decode.image", f"{MEDIA}.image:ImageMediaIO.load_bytes", ("data",),
               media.bytes_decoded, RANGES),
    api_server("media.decode.video", f"{MEDIA}.video:VideoMediaIO.load_bytes", ("data",),
               media.bytes_decoded, RANGES),
    api_server("media.decode.audio", f"{MEDIA}.audio:AudioMediaIO.load_bytes", ("data",),
               media.bytes_decoded, RANGES),
    api_server("media.decode.audio_file", f"{MEDIA}.audio:AudioMediaIO.load_file", ("filepath",),
               media.file_decoded, RANGES),
    api_server("media.render", f"{RENDERER}.render_chat", (), media.chat_rendered, RANGES,
               When.MEDIA),
    api_server("media.render_async", f"{RENDERER}.render_chat_async", (),
               media.chat_rendered_async, RANGES, When.MEDIA),
    api_server("media.processed", f"{RENDERER}.process_for_engine", ("prompt", "arrival_time"),
               media.processed, RANGES, When.MEDIA),
    api_server("media.processed_async", f"{RENDERER}.process_for_engine_async",
               ("prompt", "arrival_time"), media.processed_async, RANGES, When.MEDIA),
    api_server(media.LOOKUP_ROW,
               "vllm.multimodal.processing.processor:BaseMultiModalProcessor._get_cache_missing_items",
               ("mm_hashes",), media.cache_looked_up, RANGES, When.MEDIA),
    # vLLM's output processor made with tracing on (--otlp-traces-endpoint) applies the OTLP rows
    # below; it is made once, so without tracing nothing is applied per request. EngineCore
    # reads the same switch from its scheduler's config (scheduler.scheduler_created).
    api_server("otlp.tracing_enabled", f"{OUTPUT}.__init__", ("tracing_enabled",),
               rs.output_processor_created, OTLP),
    api_server("otlp.request_added", f"{OUTPUT}.add_request", ("request",), rs.request_added,
               OTLP, When.OTLP),
    api_server("otlp.request_span", f"{OUTPUT}.do_tracing", ("req_state",), rs.request_traced,
               OTLP, When.OTLP),
]


def worker(name, path, params, wrapper, feature, runner=None, when=When.START,
           releases="") -> Hook:
    return Hook(name, path, params, wrapper, feature, Process.WORKER, runner=runner,
                releases=V1_RELEASES if runner == V1 else releases, when=when)


def standalone(name, path, params, wrapper, feature, when=When.START) -> Hook:
    return worker(name, path, params, wrapper, feature, V2_STANDALONE, when, STANDALONE_RELEASES)


# Worker: the stages under `gpu_model_runner: preprocess` (docs/design.md §3), the step's shape,
# and what rides to EngineCore; worker rows name the model runner whose code they wrap.
WORKER_ROWS = [
    worker("ranges.ec_connector",
           "vllm.distributed.ec_transfer.ec_connector.factory:ECConnectorFactory.create_connector",
           ("role",), ws.connector_created, RANGES),
    # Model Runner V1 (`gpu_model_runner`, the CPU runner's base; gone in vLLM 0.34).
    worker("ranges.vit_forward", f"{RUNNER_V1}.timed_encoder_operation", (),
           ws.encoder_forward, RANGES, V1),
    worker("ranges.gather_mm_embeddings", f"{RUNNER_V1}._gather_mm_embeddings",
           ("shift_computed_tokens",), ws.gather_mm_embeddings, RANGES, V1),
    worker("ranges.prepare_mm_inputs", f"{RUNNER_V1}._prepare_mm_inputs", (),
           ws.prepare_mm_inputs, RANGES, V1),
    worker("ranges.embed_input_ids.cpu",
           "vllm.v1.worker.cpu_model_runner:CPUModelRunner.load_model", (), ws.model_loaded,
           RANGES, V1),
    worker("ranges.embed_input_ids.gpu", f"{RUNNER_V1}.load_model", (), ws.model_loaded, RANGES,
           V1),
    worker("telemetry.step_shape", f"{RUNNER_V1}._prepare_inputs", ("num_scheduled_tokens",),
           st.inputs_prepared, TELEMETRY, V1),
    worker("stage_metrics.execute_model", f"{RUNNER_V1}.execute_model", (), outputs.carried,
           METRICS, V1),
    worker("stage_metrics.sample_tokens", f"{RUNNER_V1}.sample_tokens", (), outputs.carried, METRICS,
           V1),
    worker("stage_metrics.async_output",
           "vllm.v1.worker.gpu_model_runner:AsyncGPUModelRunnerOutput.get_output", (),
           outputs.carried, METRICS, V1),
    # The step's own ranges through mmscope's backends, only while it traces: V1 calls the name
    # its module imported, so that module's name is wrapped (the scheduler's and the engine's
    # scopes, none of them a stage's parent, keep vLLM's own switches).
    worker("ranges.vllm_scopes.runner",
           "vllm.v1.worker.gpu_model_runner:record_function_or_nullcontext", ("name",),
           sc.vllm_scope, RANGES, V1, When.TRACING),
    # Model Runner V2 (`gpu/model_runner`, the default on GPUs with Triton; the only one from
    # vLLM 0.34). It has no counterpart of V1's _prepare_mm_inputs, so no prepare stage. Its
    # encoder batches are vit_forward: the model's embed_multimodal (wrapped at load_model) or
    # the encoder's CUDA graph, inside a step's timed_encoder_operation.
    worker("ranges.vit_forward.v2", f"{ENCODER_V2}.timed_encoder_operation", (), ws.encoder_step,
           RANGES, V2),
    worker("ranges.vit_forward.v2.cudagraph",
           "vllm.v1.worker.encoder_cudagraph:EncoderCudaGraphManager.execute", (),
           ws.encoder_batch, RANGES, V2),
    worker("ranges.gather_mm_embeddings.v2", f"{ENCODER_V2}.gather_mm_embeddings",
           ("draft_lookahead",), ws.gather_mm_embeddings, RANGES, V2),
    worker("ranges.embed_input_ids.v2", f"{RUNNER_V2}.load_model", (), ws.model_loaded, RANGES,
           V2),
    worker("telemetry.step_shape.v2", f"{RUNNER_V2}.prepare_inputs", (), st.batch_prepared,
           TELEMETRY, V2),
    worker("stage_metrics.sample_tokens.v2", f"{RUNNER_V2}.sample_tokens", (), outputs.carried,
           METRICS, V2),
    worker("stage_metrics.async_output.v2", "vllm.v1.worker.gpu.async_utils:AsyncOutput.get_output",
           (), outputs.carried_as(stages.MODEL_RUNNER_OUTPUT), METRICS, V2),
    # V2 opens no range of its own: mmscope opens the step's at the calls that bound its phases
    # (worker/step_scopes.py), only while it traces.
    worker("ranges.vllm_scopes.v2.step", f"{RUNNER_V2}.execute_model", ("dummy_run",),
           sc.step_executed, RANGES, V2, When.TRACING),
    worker("ranges.vllm_scopes.v2.forward",
           "vllm.v1.worker.gpu.async_utils:StepTimingCollector.forward_start", (),
           sc.forward_started, RANGES, V2, When.TRACING),
    worker("ranges.vllm_scopes.v2.sample", f"{RUNNER_V2}.sample", (), sc.sampled, RANGES, V2,
           When.TRACING),
    worker("ranges.vllm_scopes.v2.bookkeep", f"{RUNNER_V2}.postprocess_sampled", (),
           sc.bookkept, RANGES, V2, When.TRACING),
    # Model Runner V2 on CPUs without Triton (vLLM 0.34, `cpu/standalone_model_runner.py`): the
    # same phases in classes of its own. Its step's forward starts where it hands the batch to
    # its KV connector (V2's StepTimingCollector does not exist there); it has no async output,
    # so no ModelRunnerOutput range: sample_tokens builds the output itself.
    standalone("ranges.vit_forward.standalone", f"{ENCODER_STANDALONE}.timed_encoder_operation",
               (), ws.encoder_step, RANGES),
    standalone("ranges.gather_mm_embeddings.standalone",
               f"{ENCODER_STANDALONE}.gather_mm_embeddings", (), ws.gather_mm_embeddings, RANGES),
    standalone("ranges.embed_input_ids.standalone", f"{RUNNER_STANDALONE}.load_model", (),
               ws.model_loaded, RANGES),
    standalone("telemetry.step_shape.standalone", f"{RUNNER_STANDALONE}.prepare_inputs", (),
               st.batch_prepared, TELEMETRY),
    standalone("stage_metrics.sample_tokens.standalone", f"{RUNNER_STANDALONE}.sample_tokens", (),
               outputs.carried, METRICS),
    standalone("ranges.vllm_scopes.standalone.step", f"{RUNNER_STANDALONE}.execute_model",
               ("dummy_run",), sc.step_executed, RANGES, When.TRACING),
    standalone("ranges.vllm_scopes.standalone.forward", f"{KV_STANDALONE}:KVConnector.pre_forward",
               (), sc.forward_started, RANGES, When.TRACING),
    standalone("ranges.vllm_scopes.standalone.forward.kv",
               f"{KV_STANDALONE}:ActiveKVConnector.pre_forward", (), sc.forward_started, RANGES,
               When.TRACING),
    standalone("ranges.vllm_scopes.standalone.sample", f"{RUNNER_STANDALONE}.sample", (),
               sc.sampled, RANGES, When.TRACING),
    standalone("ranges.vllm_scopes.standalone.bookkeep",
               f"{RUNNER_STANDALONE}.postprocess_sampled", (), sc.bookkept, RANGES, When.TRACING),
]

TABLE = Table(ENGINE_CORE_ROWS + API_SERVER_ROWS + WORKER_ROWS, switches={TTFT_PARTS: ttft_split.ENV})
