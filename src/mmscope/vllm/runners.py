"""vLLM's model runners: which one a worker uses and which of mmscope's hooks apply to it. V1
(`gpu_model_runner`, the CPU default up to vLLM 0.33); V2 (`gpu/model_runner`, the default on
GPUs with Triton, the only one from 0.34); and from 0.34, for CPUs without Triton, V2's standalone
CPU runner, whose code is its own, so its hooks are its own.
"""
from __future__ import annotations

from mmscope.emit import tracing
from mmscope.log import logger
from mmscope.vllm.patching import Status, When, in_release

V1, V2, V2_STANDALONE = "v1", "v2", "v2_standalone"
# The runner's name in vLLM's words: the standalone runner is a Model Runner V2 too.
LABEL = {V1: "Model Runner V1", V2: "Model Runner V2", V2_STANDALONE: "Model Runner V2"}
# ... and the code its hooks wrap, where a label is not enough
TITLE = {V1: "Model Runner V1", V2: "Model Runner V2",
         V2_STANDALONE: "Model Runner V2, standalone CPU runner"}
SHORT = {V1: "V1", V2: "V2", V2_STANDALONE: "V2 standalone"}
RUNNER_V1 = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
RUNNER_V2 = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"
RUNNER_STANDALONE = "vllm.v1.worker.cpu.standalone_model_runner:StandaloneCPUModelRunner"
# The runners each release has (docs/vllm-0.34.md: 0.34 removed V1 and added the standalone one).
RELEASE_RUNNERS = {"0.32": (V1, V2), "0.33": (V1, V2), "0.34": (V2, V2_STANDALONE)}


def runner_of(model_runner) -> str:
    names = {f"{c.__module__}:{c.__qualname__}" for c in type(model_runner).__mro__}
    if RUNNER_STANDALONE in names:
        return V2_STANDALONE
    return V2 if RUNNER_V2 in names else V1


def is_v2(runner: str | None) -> bool:
    return runner in (V2, V2_STANDALONE)


def release_runners(version: str | None) -> tuple[str, ...]:
    """The runners vLLM `version` has (V1 and V2 where the release is not in the table)."""
    release = ".".join((version or "").split("+")[0].split(".")[:2])
    return RELEASE_RUNNERS.get(release, (V1, V2))


def expected(version: str | None) -> tuple[str, str]:
    """(runner, why): what vLLM picks in this environment before it knows the model (`mmscope
    doctor`, the series of hooks turned off); a worker's start-up line names the one it uses."""
    if V1 not in release_runners(version):
        from vllm.platforms import current_platform

        standalone = getattr(current_platform, "uses_standalone_cpu_model_runner", None)
        if standalone is not None and standalone():
            return V2_STANDALONE, (f"vLLM {version} on a CPU without Triton's backend runs "
                                   "the standalone CPU runner")
        return V2, f"vLLM {version} has no other"
    import vllm.envs as envs

    forced = envs.VLLM_USE_V2_MODEL_RUNNER
    if forced is not None:
        return (V2 if forced else V1), f"VLLM_USE_V2_MODEL_RUNNER={int(forced)}"
    from vllm.triton_utils.importing import HAS_TRITON

    if not HAS_TRITON:
        return V1, "no Triton backend for this device, which V2 requires"
    return V2, ("vLLM's default with Triton; a model using a feature V2 lacks gets V1, as the "
                "worker's start-up line says")


def possible(version: str | None) -> tuple[str, ...]:
    """The runners a worker here may use: up to vLLM 0.33 V1 or V2 (a model using a feature V2
    lacks gets V1), from 0.34 the one the platform decides."""
    runners = release_runners(version)
    return runners if V1 in runners else (expected(version)[0],)


def applies(hook, runner: str) -> bool:
    return hook.runner is None or hook.runner == runner


_announced = False


def announce(model_runner, table) -> None:
    """Once per worker process: the runner it uses and how its hooks stand."""
    global _announced
    if _announced:
        return
    _announced = True
    runner = runner_of(model_runner)
    # this release's rows of the runner, those that open ranges only while mmscope traces
    rows = [h for h in table if h.runner == runner and in_release(h, table.version)
            and (h.when is When.START or tracing.on)]
    applied = [h for h in rows if h.status is Status.APPLIED]
    others = [h for h in table if h.runner not in (None, runner) and in_release(h, table.version)]
    line = (f"mmscope: this worker runs {LABEL[runner]} ({type(model_runner).__qualname__}): "
            f"{len(applied)} of its {len(rows)} hooks applied")
    left = [f"{h.name} ({h.status})" for h in rows if h.status is not Status.APPLIED]
    if left:
        line += "; not applied: " + ", ".join(left)
    if others:
        owners = ", ".join(sorted({SHORT[h.runner] for h in others}))
        line += f"; the other runner's {len(others)} hooks ({owners}) do not apply here"
    else:
        line += "; no other runner's hooks in this release"
    logger.info("%s", line)
