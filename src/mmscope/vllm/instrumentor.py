"""`VllmInstrumentor`: applies and reverts every hook of the target table, once per process.

Like an OpenTelemetry instrumentor: declares the versions it supports; instrument() / uninstrument().
"""
from __future__ import annotations

import os

from mmscope.carry import ttft
from mmscope.emit import tracing
from mmscope.log import logger
from mmscope.vllm import patching, request_spans, schema, stat_loggers, targets

ENV_VARS = {
    "VLLM_MM_CACHE_PROBE": "1: log one mm_cache_probe HIT/MISS/DEFERRED line per encoder input",
}


class VllmInstrumentor:
    supported = targets.SUPPORTED_VLLM

    def __init__(self):
        self.hooks = targets.all_hooks()
        self.scope_hooks = targets.vllm_scope_hooks()
        self.request_span_hooks = targets.otlp_request_hooks()
        self.instrumented = False

    def vllm_version(self) -> str | None:
        try:
            import vllm
            return vllm.__version__
        except Exception:  # noqa: BLE001
            return None

    def version_supported(self) -> bool:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        v = self.vllm_version()
        return v is not None and Version(v.split("+")[0]) in SpecifierSet(self.supported)

    def instrument(self) -> dict[str, str]:
        if self.instrumented:
            return self.status()
        from mmscope.vllm.release_check import standing

        version = self.vllm_version()
        if not self.version_supported():
            logger.warning("mmscope: vLLM %s is outside the supported range %s; hooks whose "
                           "targets match are applied, the others are reported by `mmscope doctor`",
                           version, self.supported)
        elif standing(version) != "tested":
            logger.info("mmscope: vLLM %s is %s, not tested; `mmscope doctor` shows every hook",
                        version, standing(version))
        register_env_vars()
        schema.inject_scheduler_stats_fields()
        _apply(self.hooks + (self.scope_hooks if tracing.on else []))
        if request_spans.SPANS is not None:  # vLLM already traces requests in this process
            self.trace_requests()
        stat_loggers.install_log_filter()
        patching.rewrap_instances()
        self.instrumented = True
        return self.status()

    def trace_requests(self) -> None:
        """vLLM traces requests in this process: the rows that add to its request span."""
        _apply(self.request_span_hooks)

    def uninstrument(self) -> None:
        for hook in reversed(self.all_hooks()):
            hook.revert()
        patching.unwrap_instances()
        stat_loggers.remove_log_filter()
        self.instrumented = False

    def status(self) -> dict[str, str]:
        return {h.name: h.describe() for h in self.hooks}

    def all_hooks(self) -> list:
        """Every row, those applied only while mmscope or vLLM traces included."""
        return self.hooks + self.scope_hooks + self.request_span_hooks


def _apply(hooks) -> None:
    """Each hook unless MMSCOPE_SKIP_HOOKS leaves it out or its feature is off."""
    skipped = skipped_hooks()
    split_ttft = ttft.enabled()
    for hook in hooks:
        if hook.name.startswith(skipped) or hook.feature in skipped:
            hook.status = "off (MMSCOPE_SKIP_HOOKS)"
            continue
        if hook.feature == "ttft_parts" and not split_ttft:
            hook.status = f"off ({ttft.ENV}=1 turns it on)"
            continue
        hook.apply()


def skipped_hooks() -> tuple[str, ...]:
    """MMSCOPE_SKIP_HOOKS=name-prefix,feature,...: leave those hooks out (an escape hatch for
    production, and how the cost benchmark attributes instructions to each feature)."""
    raw = os.environ.get("MMSCOPE_SKIP_HOOKS", "")
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def register_env_vars() -> None:
    """Declare our VLLM_* variables in vLLM's table so its environment check does not warn."""
    import vllm.envs as envs

    for name in ENV_VARS:
        envs.environment_variables.setdefault(name, lambda name=name: os.environ.get(name, "0"))


_instrumentor: VllmInstrumentor | None = None


def get_instrumentor() -> VllmInstrumentor:
    global _instrumentor
    if _instrumentor is None:
        _instrumentor = VllmInstrumentor()
    return _instrumentor
