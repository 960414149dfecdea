#!/usr/bin/env bash
# Set up and run every check: the nox sessions lint, docs, core, dingtalk, local, ray,
# integration and bench-quick (see noxfile.py), then one summary of all test suites. Some run
# in two lanes at once, the Ray suites and the benchmarks after them (see below). Needs only
# Python 3.11+ and pip: nox and uv are installed into .venvs/tools, the environments into .nox/
# (reused, so a second run is fast). Every session runs even when an earlier one fails; the exit
# code is non-zero when any failed.
#
# nox's output goes to log files in .test-reports/ (lane1.log, ...; named as they start): the
# terminal gets one line as each session starts and one as it ends (result, duration, its
# tests' counts, what passed and failed so far), a line naming what still runs every 2 minutes
# without one, then the end of each failed session's output and the summary table. Given one
# session only, its output is shown as it runs (and kept in .test-reports/all.log).
#
#   bash scripts/test.sh                     # everything (what CI runs)
#   bash scripts/test.sh core local          # some sessions (also: bench, demo, dist)
#   bash scripts/test.sh ray -- -k node -x   # arguments after "--" go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
TWINKLE_TEST_STARTED=$(date +%s) # the progress lines' clock starts here
export TWINKLE_TEST_STARTED
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
SHOWN_REPORTS=${REPORTS#"$PWD"/}

status=0
# run_nox REPORT LOG SESSION...: one nox run of the sessions, its report in $REPORTS/REPORT.json,
# its output in $REPORTS/LOG.log (and on the terminal too when there is no follower, below).
run_nox() {
  local report=$1 name=$2
  shift 2
  local args=(--report "$REPORTS/$report.json" --sessions "$@")
  [ ${#POSARGS[@]} -eq 0 ] || args+=(-- "${POSARGS[@]}")
  if [ -n "$follower" ]; then
    "$NOX" "${args[@]}" >"$REPORTS/$name.log" 2>&1
  else
    "$NOX" "${args[@]}" 2>&1 | tee "$REPORTS/$name.log"
    return "${PIPESTATUS[0]}"
  fi
}

# The progress lines, read from the logs as they grow (scripts/summarize_tests.py --follow).
follower=""
if [ ${#SESSIONS[@]} -gt 1 ]; then
  "$TOOLS/bin/python" scripts/summarize_tests.py --follow "$REPORTS" "${SESSIONS[@]}" &
  follower=$!
fi

# Two lanes of nox sessions run at once, each its own nox process: the static checks then the
# torchrun suite (lint, docs, local), beside the pure-Python suites (core, dingtalk, whose
# tests mostly wait). The suites that start Ray clusters, and the benchmarks, run after both,
# in order, with nothing beside them: a third lane running the Ray suite from the start saved
# 47 s of a quiet 808 s run, but under a loaded machine a Ray node it started missed Ray's
# own 30 s start-up bound (docs/performance.md, "The test suites"). Each lane's output is in its
# log. Given arguments for pytest (after "--"), everything runs in order, in one nox process.
LANES=("lint docs local" "core dingtalk")
declare -a LANE_SESSIONS=("" "")
LATER=()
for s in "${SESSIONS[@]}"; do
  placed=0
  for i in "${!LANES[@]}"; do
    if [[ " ${LANES[$i]} " == *" $s "* ]]; then
      LANE_SESSIONS[$i]="${LANE_SESSIONS[$i]} $s"
      placed=1
    fi
  done
  [ "$placed" -eq 1 ] || LATER+=("$s")
done
used=0
for lane in "${LANE_SESSIONS[@]}"; do [ -z "$lane" ] || used=$((used + 1)); done
if [ "$used" -gt 1 ] && [ ${#POSARGS[@]} -eq 0 ]; then
  declare -A lane_of=()
  for i in "${!LANE_SESSIONS[@]}"; do
    read -r -a lane <<<"${LANE_SESSIONS[$i]}"
    [ ${#lane[@]} -gt 0 ] || continue
    log "lane $((i + 1)): ${lane[*]} (output: $SHOWN_REPORTS/lane$((i + 1)).log)"
    run_nox "nox-lane$((i + 1))" "lane$((i + 1))" "${lane[@]}" &
    lane_of[$!]=$((i + 1))
  done
  while [ ${#lane_of[@]} -gt 0 ]; do
    lane_status=0
    done_pid=""
    wait -n -p done_pid "${!lane_of[@]}" || lane_status=$?
    [ -n "$done_pid" ] || break # nothing left to wait for
    [ "$lane_status" -eq 0 ] || status=$lane_status
    unset "lane_of[$done_pid]"
  done
  if [ ${#LATER[@]} -gt 0 ]; then
    later_status=0
    log "then: ${LATER[*]} (output: $SHOWN_REPORTS/later.log)"
    run_nox nox-later later "${LATER[@]}" || later_status=$?
    [ "$later_status" -eq 0 ] || status=$later_status
  fi
elif [ -n "$follower" ]; then
  log "${SESSIONS[*]}, in order (output: $SHOWN_REPORTS/all.log)"
  run_nox nox all "${SESSIONS[@]}" || status=$?
else # one session: its output as it runs
  run_nox nox all "${SESSIONS[@]}" || status=$?
fi

# The follower reads the logs to their end, then shows the end of each failed session's output.
if [ -n "$follower" ]; then
  touch "$REPORTS/.done"
  wait "$follower" || true
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
