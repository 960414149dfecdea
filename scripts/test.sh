#!/usr/bin/env bash
# Set up and run every check: the nox sessions lint, docs, core, dingtalk, local, ray,
# integration and bench-quick (see noxfile.py), then one summary of all test suites. Needs only
# Python 3.11+ and pip: nox and uv are installed into .venvs/tools, the environments into .nox/
# (reused, so a second run is fast). Every session runs even when an earlier one fails; the exit
# code is non-zero when any failed.
#
#   bash scripts/test.sh                     # everything (what CI runs)
#   bash scripts/test.sh core local          # some sessions (also: bench, demo, dist)
#   bash scripts/test.sh ray -- -k node -x   # arguments after "--" go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tools.sh

SESSIONS=()
POSARGS=()
while [ $# -gt 0 ]; do
  if [ "$1" = -- ]; then
    shift
    POSARGS=("$@")
    break
  fi
  SESSIONS+=("$1")
  shift
done
[ ${#SESSIONS[@]} -gt 0 ] || SESSIONS=(lint docs core dingtalk local ray integration bench-quick)

ensure_tools
REPORTS="$PWD/.test-reports"
rm -rf "$REPORTS" && mkdir -p "$REPORTS"

status=0
NOX_ARGS=(--report "$REPORTS/nox.json" --sessions "${SESSIONS[@]}")
[ ${#POSARGS[@]} -eq 0 ] || NOX_ARGS+=(-- "${POSARGS[@]}")
"$NOX" "${NOX_ARGS[@]}" || status=$?

# One summary: every test suite's counts, plus each other session that failed (lint, docs, ...).
SUITES=()
for s in "${SESSIONS[@]}"; do
  case "$s" in core | dingtalk | local | ray | integration) SUITES+=("$s") ;; esac
done
if [ ${#SUITES[@]} -gt 0 ]; then
  log "summary (reports in $REPORTS)"
  "$TOOLS/bin/python" scripts/summarize_tests.py "$REPORTS" "${SUITES[@]}" || status=1
fi
exit "$status"
