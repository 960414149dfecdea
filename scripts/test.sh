#!/usr/bin/env bash
# Set up and run every test suite. Each package's suite runs in an environment holding only
# that package and what it depends on (tests/core without torch or ray), then the integration
# suite runs with everything. Idempotent: environments are rebuilt only when a pyproject changes.
#
#   bash scripts/test.sh            # everything
#   bash scripts/test.sh core local # only some suites (lint, docs, core, dingtalk, local, ray, integration)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

SUITES=("$@")
[ ${#SUITES[@]} -gt 0 ] || SUITES=(lint docs core dingtalk local ray integration)
REPORTS="$PWD/.test-reports"
rm -rf "$REPORTS" && mkdir -p "$REPORTS"
# Never attach tests to some other Ray cluster on this machine.
unset RAY_ADDRESS
export RAY_USAGE_STATS_ENABLED=0

RAN_PYTEST=0
run_pytest() {  # run_pytest VENV SUITE PATH...
  local venv=$1 suite=$2; shift 2
  RAN_PYTEST=$((RAN_PYTEST + 1))
  log "tests: $suite ($*)"
  # The pytest script (not `python -m pytest`) keeps the repository root off sys.path.
  "$VENVS/$venv/bin/pytest" "$@" --junitxml="$REPORTS/$suite.xml"
}

for suite in "${SUITES[@]}"; do
  case "$suite" in
    lint)
      ensure_env lint ./twinkle_core -- mypy
      log "ruff (every package) and mypy (twinkle-core's public API)"
      "$VENVS/lint/bin/ruff" check twinkle_core twinkle_local twinkle_ray \
        twinkle_notify_dingtalk tests examples benchmarks scripts
      (cd twinkle_core && "$VENVS/lint/bin/mypy" twinkle_core)
      ;;
    docs)
      ensure_env docs ./twinkle_core -- mkdocs "mkdocstrings[python]"
      log "docs: mkdocs build --strict"
      "$VENVS/docs/bin/mkdocs" build --strict --quiet --site-dir "$REPORTS/site"
      ;;
    core)
      # Installed as a user would (`pip install ./twinkle_core`), without torch or ray.
      ensure_env core-installed --installed ./twinkle_core
      run_pytest core-installed core tests/core
      ;;
    dingtalk)
      ensure_env dingtalk ./twinkle_core ./twinkle_notify_dingtalk
      run_pytest dingtalk dingtalk tests/notify_dingtalk
      ;;
    local)
      ensure_env local --torch ./twinkle_core ./twinkle_local
      run_pytest local local tests/local
      ;;
    ray)
      ensure_env ray --torch ./twinkle_core ./twinkle_local ./twinkle_ray
      run_pytest ray ray tests/ray
      ;;
    integration)
      ensure_env full --torch ./twinkle_core ./twinkle_local ./twinkle_ray ./twinkle_notify_dingtalk
      run_pytest full integration tests/integration
      ;;
    *) echo "unknown suite: $suite" >&2; exit 2 ;;
  esac
done

if [ "$RAN_PYTEST" -gt 0 ]; then
  "$PYTHON" scripts/summarize_tests.py "$REPORTS"
fi
