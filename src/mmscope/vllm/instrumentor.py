"""`VllmInstrumentor`: applies and reverts the rows of the target table, once per process.

Like an OpenTelemetry instrumentor: declares the versions it supports; instrument() / uninstrument().
"""
from __future__ import annotations

from mmscope.carry import ttft_split
from mmscope.emit import tracing
from mmscope.flags import flag
from mmscope.log import logger
from mmscope.vllm import patching, targets
from mmscope.vllm.api_server import request_spans, stat_loggers
from mmscope.vllm.patching import When
from mmscope.vllm.releases import SUPPORTED_VLLM, standing
from mmscope.vllm.wire import scheduler_stats

ENV_VARS = {
    "VLLM_MM_CACHE_PROBE": "1: log one mm_cache_probe HIT/MISS/DEFERRED line per encoder input",
}


def vllm_version() -> str | None:
    try:
        import vllm
        return vllm.__version__
    except Exception:  # noqa: BLE001
        return None


def version_supported(version: str | None) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return version is not None and Version(version.split("+")[0]) in SpecifierSet(
        SUPPORTED_VLLM)


class VllmInstrumentor:
    supported = SUPPORTED_VLLM
    table = targets.TABLE

    def __init__(self):
        self.instrumented = False

    def instrument(self) -> dict[str, str]:
        if self.instrumented:
            return self.status()
        version = vllm_version()
        if not version_supported(version):
            logger.warning("mmscope: vLLM %s is outside the supported range %s; hooks whose "
                           "targets match are applied, the others are reported by `mmscope doctor`",
                           version, self.supported)
        elif standing(version) != "tested":
            logger.info("mmscope: vLLM %s is %s, not tested; `mmscope doctor` shows every hook",
                        version, standing(version))
        register_env_vars()
        scheduler_stats.declare_fields()
        self.table.apply(When.START, version)
        if tracing.on:
            self.table.apply(When.TRACING, version)
        if request_spans.SPANS is not None:  # vLLM already traces requests in this process
            self.table.apply(When.OTLP, version)
        if ttft_split.enabled():  # every request's processor time is a part of its split
            self.table.apply(When.MEDIA, version)
        stat_loggers.install()
        patching.rewrap_instances()
        self.instrumented = True
        return self.status()

    def uninstrument(self) -> None:
        self.table.revert()
        patching.unwrap_instances()
        stat_loggers.remove()
        self.instrumented = False

    def status(self) -> dict[str, str]:
        return {h.name: h.describe() for h in self.table}


def register_env_vars() -> None:
    """Declare our VLLM_* variables in vLLM's table so its environment check does not warn."""
    import vllm.envs as envs

    for name in ENV_VARS:
        envs.environment_variables.setdefault(name, lambda name=name: flag(name))


_instrumentor: VllmInstrumentor | None = None


def get_instrumentor() -> VllmInstrumentor:
    global _instrumentor
    if _instrumentor is None:
        _instrumentor = VllmInstrumentor()
    return _instrumentor
