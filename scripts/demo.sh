#!/usr/bin/env bash
# Set everything up and run the example pipeline unchanged under torchrun and on an embedded
# Ray cluster (plus the in-process reference), then print the per-step losses side by side.
# Needs only Python 3.11+ and pip; the environment (nox session "demo") is reused when it exists.
# Arguments go to examples/rl_pipeline.py, e.g. `bash scripts/demo.sh --steps 4`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tools.sh
ensure_tools
exec "$NOX" --sessions demo -- "$@"
