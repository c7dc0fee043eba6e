#!/usr/bin/env bash
# Set up the SECOND WebGPU runtime: onnxruntime 1.31.1 + the onnxruntime-ep-webgpu 0.4.0 plugin EP, in its own venv
# (it cannot share .venv with onnxruntime-webgpu: both own the `onnxruntime` module).
# Idempotent. Prints the interpreter path on its last line. Fails loudly.
#   venv path: $ROPE_PASSES_PLUGIN_VENV (default .venv-plugin in the repository root)
#   base interpreter: $PYTHON (default python3)
# On a machine without a GPU the plugin lists no device unless ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 is set and a
# software Vulkan driver is installed (scripts/install-webgpu-cpu.sh, as root); the check below sets the variable.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${ROPE_PASSES_PLUGIN_VENV:-.venv-plugin}
ORT_VERSION=1.31.1
PLUGIN_VERSION=0.4.0

if [ -e "$VENV/bin/python" ] && "$VENV/bin/python" -c "import onnxruntime_webgpu" 2>/dev/null; then
  echo "setup-plugin: $VENV has onnxruntime-webgpu (the other runtime); refusing to mix them" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup-plugin: creating $VENV"
  "$PY" -m venv "$VENV" || { echo "setup-plugin: python -m venv failed" >&2; exit 1; }
fi
want() {
  "$VENV/bin/python" - "$ORT_VERSION" "$PLUGIN_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
ok = (version("onnxruntime") == sys.argv[1] and version("onnxruntime-ep-webgpu") == sys.argv[2])
import onnx, onnx_ir, numpy, onnxruntime, onnxruntime_ep_webgpu  # noqa: E401,F401
sys.exit(0 if ok else 1)
PY
}
if want; then
  echo "setup-plugin: onnxruntime $ORT_VERSION + onnxruntime-ep-webgpu $PLUGIN_VERSION already in $VENV"
else
  echo "setup-plugin: installing onnxruntime==$ORT_VERSION onnxruntime-ep-webgpu==$PLUGIN_VERSION onnx onnx-ir numpy"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
  if ! "$VENV/bin/python" -m pip install --disable-pip-version-check \
      "onnxruntime==$ORT_VERSION" "onnxruntime-ep-webgpu==$PLUGIN_VERSION" onnx onnx-ir numpy \
      >"$VENV/pip-install.log" 2>&1; then
    grep -v '^WARNING: Location' "$VENV/pip-install.log" >&2 || true
    echo "setup-plugin: pip install failed (log: $VENV/pip-install.log)" >&2
    exit 1
  fi
  want || { echo "setup-plugin: installed, but the versions/imports do not check out" >&2; exit 1; }
fi

# the plugin must register and list a WebGPU device (software adapter allowed, for GPU-less machines)
if ! ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=${ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER:-1} "$VENV/bin/python" - <<'PY'
import sys
import onnxruntime as ort
import onnxruntime_ep_webgpu
ort.register_execution_provider_library("webgpu", onnxruntime_ep_webgpu.get_library_path())
devs = [d for d in ort.get_ep_devices() if d.ep_name == "WebGpuExecutionProvider"]
if not devs:
    print("setup-plugin: the plugin registered but lists no WebGpuExecutionProvider device "
          "(no Vulkan driver? run scripts/install-webgpu-cpu.sh as root)", file=sys.stderr)
    sys.exit(1)
print(f"setup-plugin: onnxruntime {ort.__version__}, WebGPU device found")
PY
then
  echo "setup-plugin: WebGPU plugin check failed" >&2
  exit 1
fi
echo "$(cd "$VENV" && pwd)/bin/python"
