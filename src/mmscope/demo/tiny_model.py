"""`mmscope tiny-model --arch llava|qwen2_5_vl|qwen2_audio`: a tiny model directory vLLM CPU serves.

No network: the tokenizer is a byte-level BPE trained here, the weights are seeded random numbers.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from mmscope.demo.tiny_llava import IMAGE_SIZE, IMAGE_TOKENS  # noqa: F401 - LLaVA, the default

ARCHS = {
    "llava": "mmscope.demo.tiny_llava",
    "qwen2_5_vl": "mmscope.demo.tiny_qwen2_5_vl",
    "qwen2_audio": "mmscope.demo.tiny_qwen2_audio",
}
DEFAULT_ARCH = "llava"
MARKER = "mmscope-tiny-model.json"  # written last: its presence means the directory is complete


def family(arch: str):
    """The module of a family: its constants, `build_into(dir)` and `prompt(items, text)`."""
    return importlib.import_module(ARCHS[arch])


def build(out_dir: str, seed: int = 0, arch: str = DEFAULT_ARCH) -> str:
    """Write the model directory (idempotent: an existing complete directory is reused)."""
    out_dir = os.path.abspath(out_dir)
    if is_built(out_dir, seed, arch):
        return out_dir
    import torch

    torch.manual_seed(seed)
    os.makedirs(out_dir, exist_ok=True)
    family(arch).build_into(out_dir)
    with open(os.path.join(out_dir, MARKER), "w") as f:
        json.dump({"seed": seed, "arch": arch}, f)
    return out_dir


def is_built(out_dir: str, seed: int = 0, arch: str = DEFAULT_ARCH) -> bool:
    try:
        with open(os.path.join(out_dir, MARKER)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return False
    return marker.get("seed") == seed and marker.get("arch", DEFAULT_ARCH) == arch


def default_dir(arch: str = DEFAULT_ARCH) -> str:
    from mmscope.cache_dir import cache_dir

    return cache_dir("tiny-" + arch.replace("_", "-"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", nargs="?", default=None,
                   help="output directory, in a folder that exists (default: "
                        "~/.cache/mmscope/tiny-<arch>)")
    p.add_argument("--arch", choices=sorted(ARCHS), default=DEFAULT_ARCH,
                   help=f"model family (default {DEFAULT_ARCH})")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    p.add_argument("--force", action="store_true", help="rebuild even if the directory is complete")
    p.add_argument("--env", action="store_true",
                   help="print only the environment its server needs, as shell `export` lines: "
                        'eval "$(mmscope tiny-model DIR --env)"')


def run(args) -> int:
    import shlex

    from mmscope.demo import environment

    out = _checked_dir(args.dir or default_dir(args.arch), named=args.dir is not None)
    if args.force and os.path.exists(os.path.join(out, MARKER)):
        os.remove(os.path.join(out, MARKER))
    path = _build(out, args.seed, args.arch)
    env = environment.server_environment(os.environ.get("PYTHONPATH"))
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    if args.env:
        print(f"export {assignments}")
        return 0
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    print(f"tiny model: {path} ({size / 1e6:.1f} MB; {family(args.arch).SUMMARY})")
    print(f"serve it: {assignments} python -m vllm.entrypoints.openai.api_server --model {path} "
          "--max-model-len 1024 --enforce-eager")
    print(f'or set that environment in this shell: eval "$(mmscope tiny-model {path} --env)"')
    return 0


def _checked_dir(out: str, named: bool) -> str:
    """The directory to build in; a directory the user names must lie in a folder that exists
    (mmscope makes no folders above what it was given)."""
    from mmscope.errors import UserError

    out = os.path.abspath(out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"{out} exists and is not a directory")
    if named and not os.path.exists(os.path.dirname(out)):
        raise UserError(f"{out}: folder does not exist: {os.path.dirname(out)}")
    return out


def _build(out: str, seed: int, arch: str) -> str:
    from mmscope.errors import UserError

    try:
        return build(out, seed, arch)
    except ImportError as e:
        raise UserError(f"building the model needs torch and transformers ({e}); "
                        "install mmscope[vllm]") from None
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror}") from None


if __name__ == "__main__":
    sys.exit(run(argparse.Namespace(dir=sys.argv[1] if len(sys.argv) > 1 else None, seed=0,
                                    force=False, arch=DEFAULT_ARCH, env=False)))
