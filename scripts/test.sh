#!/usr/bin/env bash
# Set up (venv + package + WebGPU driver when missing), check style (ruff) and types (mypy), and run the test suite.
# Extra arguments go to pytest:
#   scripts/test.sh                                  # everything: what CI runs
#   scripts/test.sh -m "not corpus and not webgpu"   # the fast inner loop (markers: tests/conftest.py)
# Setup runs when the venv is missing or was set up from other setup inputs (pyproject.toml, scripts/setup.sh,
# scripts/install-webgpu-cpu.sh: their hash is stamped in the venv); ROPE_PASSES_SETUP=1 forces it.
# Tests are spread over ROPE_PASSES_TEST_WORKERS pytest-xdist workers (default 2; 0: one process). The whole suite
# keeps a file on one worker (--dist loadfile: its module fixtures, corpus rewrites, run once); a marker selection
# (-m ..., the fast loop) has no costly fixtures and balances test by test (--dist worksteal): 40 s vs 74 s here.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
stamp="$VENV/.rope-passes-setup"
inputs=$(cat pyproject.toml scripts/setup.sh scripts/install-webgpu-cpu.sh | sha256sum | cut -d' ' -f1)
if [ "${ROPE_PASSES_SETUP:-0}" = 1 ] || [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$inputs" ]; then
  rm -f "$stamp"
  bash scripts/setup.sh
  echo "$inputs" >"$stamp"
fi
"$VENV/bin/ruff" check rope_passes tests bench examples tools
"$VENV/bin/mypy" rope_passes  # configuration and strictness: [tool.mypy] in pyproject.toml
workers=${ROPE_PASSES_TEST_WORKERS:-2}
parallel=()
dist=loadfile
for arg in "$@"; do [ "$arg" = -m ] && dist=worksteal; done
[ "$workers" = 0 ] || parallel=(-n "$workers" --dist "$dist")
exec "$VENV/bin/python" -m pytest -q ${parallel[@]+"${parallel[@]}"} "$@"
