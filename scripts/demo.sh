#!/usr/bin/env bash
# Set everything up and run the example pipeline unchanged under torchrun and on an embedded
# Ray cluster (plus the in-process reference), then print the per-step losses side by side.
# Needs only Python 3.11+ and pip; the environment (nox session "demo") is reused when it exists.
# Arguments go to examples/rl_pipeline.py, e.g. `bash scripts/demo.sh --steps 4`.
#
# The terminal gets what is being set up, one line per mode and the table; nox's own output
# (its commands, the environment's set-up) is kept in .demo/setup.log, each mode's output in
# .demo/MODE.log (scripts/demo.py).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tools.sh
ensure_tools
set +e
"$NOX" --sessions demo -- "$@" 2>&1 | "$TOOLS/bin/python" scripts/demo.py --nox-output .demo/setup.log
codes=("${PIPESTATUS[@]}")
set -e
# nox's exit code, as before; the filter's only when nox succeeded.
[ "${codes[0]}" -ne 0 ] && exit "${codes[0]}"
exit "${codes[1]}"
