#!/usr/bin/env bash
# Set up (venv + package + WebGPU driver when missing), check style (ruff), and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check rope_passes tests bench examples
exec .venv/bin/python -m pytest -q "$@"
