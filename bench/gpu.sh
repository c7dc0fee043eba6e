#!/usr/bin/env bash
# The GPU evidence of issue 31 in one command (bench/gpu_evidence.py says what it measures).
#
#   bench/gpu_carry.sh                  # here, with network: fills .gpu-carry/ (wheels, Vulkan loader, corpus)
#   bench/gpu.sh                        # on the GPU machine (no network): installs the carry, runs the real plan
#   bench/gpu.sh --tiny --out DIR       # any machine with a WebGPU adapter (CI: lavapipe): the tiny plan
#
# Without --tiny it installs .gpu-carry/wheels into a target folder on PYTHONPATH (onnxruntime-webgpu wins over
# the image's onnxruntime; onnxruntime-genai with --no-deps runs on it), unpacks the Vulkan loader .deb when the
# image has no libvulkan.so.1, points Dawn at the NVIDIA ICD when it is where the device machines mount it, and reads
# the corpus from .gpu-carry/corpus. The tables go to --out (default: $OUT, else out/gpu), a log beside them.
# Other arguments go to bench/gpu_evidence.py (--budget S, --models a,b).
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TINY=0 DEST=${OUT:-$REPO/out/gpu} ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --tiny) TINY=1 ;;
    --out) DEST=$2; shift ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
mkdir -p "$DEST"
if [ $TINY = 0 ]; then
  CARRY=$REPO/.gpu-carry SITE=${ROPE_PASSES_GPU_SITE:-/tmp/rope-gpu-site}
  [ -d "$CARRY/wheels" ] || { echo "gpu.sh: no $CARRY/wheels: run bench/gpu_carry.sh first (with network)" >&2; exit 2; }
  PY=${PYTHON:-python3}
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$CARRY"/wheels/*.whl || { echo "gpu.sh: installing the carried wheels failed" >&2; exit 2; }
  if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1 '; then
    for f in "$CARRY"/debs/*.deb; do dpkg -x "$f" /; done
    ldconfig
  fi
  ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f $ICD ]; then export VK_DRIVER_FILES=$ICD; fi
  export PYTHONPATH=$SITE:$REPO ROPE_PASSES_CORPUS=$CARRY/corpus/genai
  "$PY" -m rope_passes.runtime.adapter --vulkan-devices || true
else
  PY=${ROPE_PASSES_WEBGPU_PYTHON:-$REPO/.venv/bin/python}
  export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
WORK=${ROPE_PASSES_GPU_WORK:-$(mktemp -d /tmp/rope-gpu-work.XXXXXX)}
"$PY" "$REPO/bench/gpu_evidence.py" --out "$DEST" --work "$WORK" $([ $TINY = 1 ] && echo --tiny) \
  ${ARGS[@]+"${ARGS[@]}"} 2>&1 | tee "$DEST/gpu.log"
rc=${PIPESTATUS[0]}
[ -n "${ROPE_PASSES_GPU_WORK:-}" ] || rm -rf "$WORK"
exit "$rc"
