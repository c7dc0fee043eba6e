#!/usr/bin/env bash
# Set up rope-passes on a fresh machine: a virtual environment with the package (and test tools), and - when no
# WebGPU adapter is found - Mesa's lavapipe Vulkan driver so onnxruntime-webgpu gets a real (software) adapter.
# Idempotent: what is already set up is checked, not redone.
# Usage: scripts/setup.sh [--no-driver] [--with-plugin-runtime] [--with-web-runtime]
#   --with-plugin-runtime  also set up the second WebGPU runtime (onnxruntime + the onnxruntime-ep-webgpu plugin) in
#                          its own venv, .venv-plugin (scripts/setup-plugin-runtime.sh; docs/runtimes.md)
#   --with-web-runtime     also set up the browser runtime: Debian's chromium and onnxruntime-web in .web-runtime/
#                          (scripts/setup-web-runtime.sh; check --runtime web)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
NO_DRIVER=0
WITH_PLUGIN=0
WITH_WEB=0
for arg in "$@"; do
  case "$arg" in
    --no-driver) NO_DRIVER=1 ;;
    --with-plugin-runtime) WITH_PLUGIN=1 ;;
    --with-web-runtime) WITH_WEB=1 ;;
    *) echo "setup: unknown option $arg (usage: scripts/setup.sh [--no-driver] [--with-plugin-runtime] [--with-web-runtime])" >&2; exit 2 ;;
  esac
done

# The package install is stamped with the hash of its inputs: a second run (scripts/demo.sh, then scripts/test.sh)
# installs nothing again unless pyproject.toml or this script changed; ROPE_PASSES_SETUP=1 forces it.
stamp="$VENV/.rope-passes-setup"
inputs=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "${ROPE_PASSES_SETUP:-0}" != 1 ] && [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$inputs" ] \
    && "$VENV/bin/python" -c "import rope_passes, onnxruntime, onnxruntime_genai, pytest" 2>/dev/null; then
  echo "setup: $VENV is up to date (set ROPE_PASSES_SETUP=1 to reinstall)"
else
  rm -f "$stamp"
  if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV"
    "$PY" -m venv "$VENV"
  fi
  echo "setup: installing rope-passes and its dependencies into $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
  if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' >"$VENV/pip-install.log" 2>&1; then
    grep -v '^WARNING: Location' "$VENV/pip-install.log" >&2 || true
    echo "setup: pip install failed (log: $VENV/pip-install.log)" >&2
    exit 1
  fi
  # onnxruntime-genai's generate loop, for the test that runs optimize's output folders as genai does (--no-deps:
  # onnxruntime-webgpu stays the onnxruntime module; the package is not a dependency of rope-passes)
  if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps 'onnxruntime-genai==0.18.*' \
      >>"$VENV/pip-install.log" 2>&1; then
    echo "setup: pip install onnxruntime-genai failed (log: $VENV/pip-install.log)" >&2
    exit 1
  fi
  "$VENV/bin/python" -c "import rope_passes, onnxruntime, onnxruntime_genai, pytest" || { echo "setup: install failed" >&2; exit 1; }
  if "$VENV/bin/python" -c "import torch" 2>/dev/null && ! "$PY" -c "import torch" 2>/dev/null; then
    echo "setup: warning: torch got installed into $VENV; rope-passes does not need it" >&2
  fi
  echo "$inputs" >"$stamp"
fi

probe() { "$VENV/bin/python" -m rope_passes.runtime.adapter >/dev/null 2>&1; }
if [ "$NO_DRIVER" = 1 ]; then
  echo "setup: skipping the WebGPU driver check (--no-driver)"
elif probe; then
  echo "setup: WebGPU adapter found"
else
  echo "setup: no WebGPU adapter; installing Mesa lavapipe (software Vulkan) from bookworm-backports"
  if [ "$(id -u)" = 0 ]; then
    sh scripts/install-webgpu-cpu.sh
  elif command -v sudo >/dev/null; then
    sudo sh scripts/install-webgpu-cpu.sh
  else
    echo "setup: need root to install mesa-vulkan-drivers (run scripts/install-webgpu-cpu.sh as root)" >&2
    exit 1
  fi
  probe || { echo "setup: still no WebGPU adapter after installing lavapipe" >&2; exit 1; }
  echo "setup: WebGPU adapter found"
fi
if [ "$WITH_PLUGIN" = 1 ]; then
  echo "setup: the second WebGPU runtime (onnxruntime + onnxruntime-ep-webgpu) in its own venv"
  bash scripts/setup-plugin-runtime.sh
fi
if [ "$WITH_WEB" = 1 ]; then
  echo "setup: the browser WebGPU runtime (chromium + onnxruntime-web) in .web-runtime"
  bash scripts/setup-web-runtime.sh
fi
