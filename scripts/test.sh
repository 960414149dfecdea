#!/usr/bin/env bash
# Set up and run every check: the nox sessions lint, docs, core, dingtalk, local, ray,
# integration and bench-quick (see noxfile.py), then one summary of all test suites. lint, docs
# and local run beside core and dingtalk (see below). Needs only
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
# run_nox REPORT SESSION...: one nox run of the sessions, its report in $REPORTS/REPORT.json.
run_nox() {
  local report=$1
  shift
  local args=(--report "$REPORTS/$report.json" --sessions "$@")
  [ ${#POSARGS[@]} -eq 0 ] || args+=(-- "${POSARGS[@]}")
  "$NOX" "${args[@]}"
}

# The static checks (lint, docs), then the torchrun suite (local), run in a second nox process
# beside the pure-Python suites (core, dingtalk), whose tests mostly wait: the two processes
# take about as long as each other (the local suite's tests hold under a loaded machine). The
# suites that start Ray clusters, and the benchmarks, start only when both are done, so
# nothing runs beside them. The background process's output is printed once it ends. Given
# arguments for pytest (after "--"), everything runs in order.
STATIC=()
PURE=()
REST=()
for s in "${SESSIONS[@]}"; do
  case "$s" in
    lint | docs | local) STATIC+=("$s") ;;
    core | dingtalk) PURE+=("$s") ;;
    *) REST+=("$s") ;;
  esac
done
if [ ${#STATIC[@]} -gt 0 ] && [ ${#PURE[@]} -gt 0 ] && [ ${#POSARGS[@]} -eq 0 ]; then
  log "${STATIC[*]} in the background (output below when done), beside ${PURE[*]}"
  run_nox nox-static "${STATIC[@]}" >"$REPORTS/static.log" 2>&1 &
  static_pid=$!
  run_nox nox "${PURE[@]}" || status=$?
  static_status=0
  wait "$static_pid" || static_status=$?
  log "output of ${STATIC[*]}"
  cat "$REPORTS/static.log"
  [ "$static_status" -eq 0 ] || status=$static_status
  if [ ${#REST[@]} -gt 0 ]; then
    rest_status=0
    run_nox nox-rest "${REST[@]}" || rest_status=$?
    [ "$rest_status" -eq 0 ] || status=$rest_status
  fi
else
  run_nox nox "${SESSIONS[@]}" || status=$?
fi

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
