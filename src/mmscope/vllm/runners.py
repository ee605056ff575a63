"""vLLM's model runners: which one a worker uses (V1, `gpu_model_runner`, the CPU default up to vLLM
0.33; V2, `gpu/model_runner`, the default on GPUs with Triton and the only one from 0.34) and which
of mmscope's hooks apply to it.
"""
from __future__ import annotations

from mmscope.emit import tracing
from mmscope.log import logger
from mmscope.vllm.patching import Status, When, in_release

V1, V2 = "v1", "v2"
LABEL = {V1: "Model Runner V1", V2: "Model Runner V2"}
RUNNER_V1 = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
RUNNER_V2 = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"
# vLLM 0.34's Model Runner V2 for CPUs without Triton, a class of its own
RUNNER_STANDALONE = "vllm.v1.worker.cpu.standalone_model_runner:StandaloneCPUModelRunner"
# The runners each release has (docs/vllm-0.34.md: 0.34 removed V1).
RELEASE_RUNNERS = {"0.32": (V1, V2), "0.33": (V1, V2), "0.34": (V2,)}


def runner_of(model_runner) -> str:
    names = {f"{c.__module__}:{c.__qualname__}" for c in type(model_runner).__mro__}
    return V2 if names & {RUNNER_V2, RUNNER_STANDALONE} else V1


def release_runners(version: str | None) -> tuple[str, ...]:
    """The runners vLLM `version` has (both where the release is not in the table)."""
    release = ".".join((version or "").split("+")[0].split(".")[:2])
    return RELEASE_RUNNERS.get(release, (V1, V2))


def expected(version: str | None) -> tuple[str, str]:
    """(runner, why): what vLLM picks in this environment before it knows the model (`mmscope
    doctor`); a worker's start-up line names the one it really uses."""
    if release_runners(version) == (V2,):
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
    others = sum(1 for h in table if h.runner not in (None, runner)
                 and in_release(h, table.version))
    line = (f"mmscope: this worker runs {LABEL[runner]} ({type(model_runner).__qualname__}): "
            f"{len(applied)} of its {len(rows)} hooks applied")
    left = [f"{h.name} ({h.status})" for h in rows if h.status is not Status.APPLIED]
    if left:
        line += "; not applied: " + ", ".join(left)
    logger.info("%s; the other runner's %d hooks do not apply here", line, others)
