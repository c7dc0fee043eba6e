#!/usr/bin/env bash
# Fills .gpu-carry/ (ignored) with what bench/gpu.sh needs on a GPU machine without network, and says its size:
#   wheels/  onnxruntime-webgpu 1.27.0, onnxruntime-genai 0.18.0 (installed --no-deps), onnx-ir 1.1.0: cp312,
#            manylinux x86_64 (the device image: Python 3.12 with onnx, onnxscript, numpy, sympy, rich)
#   debs/    the Vulkan loader (libvulkan1) for an image without one
#   corpus/  the tiny builder graphs bench/realsize.py scales, their Hugging Face configs, the real-token model
# Then, from a session lent a GPU (one call of the device tool):
#   run(command="bench/gpu.sh", carry=[".gpu-carry"], timeout_s=600)
# Everything that travels (the working tree + the carry) must stay under 64 MiB; this prints both.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
C=$REPO/.gpu-carry
PY=${PYTHON:-python3}
mkdir -p "$C/wheels" "$C/debs" "$C/corpus/genai"
plat=()
for n in 2_28 2_27 2_17 2014 1; do
  case $n in 2014|1) plat+=(--platform "manylinux${n}_x86_64") ;; *) plat+=(--platform "manylinux_${n}_x86_64") ;; esac
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$C/wheels" onnxruntime-webgpu==1.27.0 onnxruntime-genai==0.18.0 onnx-ir==1.1.0
(cd "$C/debs" && { ls libvulkan1_*.deb >/dev/null 2>&1 || apt-get download libvulkan1; })
CORPUS=${ROPE_PASSES_CORPUS:-${ROPE_PASSES_SHARED:-$REPO/../shared}/corpus/genai}
PYTHONPATH=$REPO "$PY" - "$CORPUS" "$C/corpus/genai" <<'PYEOF'
import shutil, sys
from pathlib import Path
sys.path.insert(0, "bench")
import gpu_evidence, realsize
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
rels = {realsize.MODELS[m].source for plan in gpu_evidence.PLANS.values() for m in plan.models}
rels |= {f"hf/{Path(r).parent.name}" for r in rels} | set(gpu_evidence.REAL_TOKENS)
for rel in sorted(rels):
    shutil.copytree(src / rel, dst / rel, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.npy"))
    print("corpus:", rel)
PYEOF
chmod -R u+w "$C"
tree=$(cd "$REPO" && git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null \
  | awk '{s+=$1} END {print s}')
carry=$(du -sb "$C" | cut -f1)
echo "carry: $((carry / 1048576)) MiB in $C; working tree that travels: $((tree / 1048576)) MiB; limit 64 MiB together"
if [ $((tree + carry)) -gt $((64 * 1048576)) ]; then
  echo "gpu_carry: over 64 MiB together: the tracked test fixtures (tests/fixtures) are most of the tree; a GPU" \
       "session can leave them out of its checkout for the call: git sparse-checkout set --no-cone '/*'" \
       "'!/tests/fixtures/' (and git sparse-checkout disable after)" >&2
fi
