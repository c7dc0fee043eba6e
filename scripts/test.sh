#!/usr/bin/env bash
# Set up (venv + package + WebGPU driver when missing), check style (ruff) and types (mypy), and run the test suite.
# Extra arguments go to pytest:
#   scripts/test.sh                                  # everything: what CI runs
#   scripts/test.sh -m "not corpus and not webgpu"   # the fast inner loop (markers: tests/conftest.py)
# Set-up (scripts/setup.sh, idempotent: an up-to-date .venv is not reinstalled) gives the tests what they need:
#   the whole suite: .venv, the WebGPU driver when no adapter is found, the second WebGPU runtime (.venv-plugin) and
#   the JS runtimes (chromium + onnxruntime-web, webgpu, onnxruntime-node, transformers.js in .web-runtime/);
#   a marker selection that excludes webgpu (the fast loop): .venv only - no driver, no .venv-plugin, no browser
#   (tests/conftest.py hides both from such a run, so a test that needs them and lacks the marker fails).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export VENV
needs_webgpu=1
prev=
for arg in "$@"; do
  if [ "$prev" = -m ] && [[ "$arg" == *"not webgpu"* ]]; then needs_webgpu=0; fi
  prev=$arg
done
if [ "$needs_webgpu" = 1 ]; then
  bash scripts/setup.sh --with-plugin-runtime --with-web-runtime
else
  bash scripts/setup.sh --no-driver
fi
# the interpreters of both runtimes, wherever the venvs are (rope_passes/runtimes/installed.py reads these)
export ROPE_PASSES_WEBGPU_PYTHON=${ROPE_PASSES_WEBGPU_PYTHON:-$(cd "$VENV" && pwd)/bin/python}
plugin_venv=${ROPE_PASSES_PLUGIN_VENV:-.venv-plugin}
if [ -z "${ROPE_PASSES_PLUGIN_PYTHON+x}" ] && [ -x "$plugin_venv/bin/python" ]; then
  export ROPE_PASSES_PLUGIN_PYTHON="$(cd "$plugin_venv" && pwd)/bin/python"
fi
"$VENV/bin/ruff" check rope_passes tests bench examples tools
"$VENV/bin/mypy" rope_passes  # configuration and strictness: [tool.mypy] in pyproject.toml
workers=${ROPE_PASSES_TEST_WORKERS:-2}
parallel=()
dist=loadfile
for arg in "$@"; do [ "$arg" = -m ] && dist=worksteal; done
[ "$workers" = 0 ] || parallel=(-n "$workers" --dist "$dist")
exec "$VENV/bin/python" -m pytest -q ${parallel[@]+"${parallel[@]}"} "$@"
