"""Start-up of every process of a vLLM server that serves an mmscope tiny model: installs the
torchvision-free image and video processors there (vLLM's engine processes start with spawn)."""
import importlib.machinery
import importlib.util
import os
import sys

from mmscope.demo import environment

environment.install()


def _run_next_sitecustomize() -> None:
    """Python imports only the first sitecustomize on the path; one further along (a site's, a
    test's) still runs after this one."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_run_next_sitecustomize()
