#!/usr/bin/env bash
# Set up, then run the main job on the embedded tiny decoder: build → inspect → optimize (webgpu-graph) → check.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/rope-passes demo "$@"
