# Shared by scripts/test.sh and scripts/demo.sh: a small virtualenv .venvs/tools holding nox and
# uv (pinned below), created with nothing but Python and pip; everything else is a nox session
# (noxfile.py), whose environments uv builds under .nox/.
# shellcheck shell=bash

PYTHON="${PYTHON:-python3}"
VENVS="${TWINKLE_VENVS:-$PWD/.venvs}"
TOOLS="$VENVS/tools"
NOX="$TOOLS/bin/nox"
TOOLS_REQUIREMENTS=(nox==2026.10.20 uv==0.13.9)

log() {
  if [ -t 1 ]; then printf '\n\033[1m== %s\033[0m\n' "$*"; else printf '\n== %s\n' "$*"; fi
}

# pip warns about every package that a configured local index folder lacks; nobody running
# these scripts can act on that, so those lines (only those) are dropped.
quiet_pip() {
  local out
  if ! out=$("$@" 2>&1); then
    printf '%s\n' "$out" >&2
    return 1
  fi
  printf '%s\n' "$out" | grep -v -e 'is ignored: it is neither a file nor a directory' -e '^$' >&2 || true
}

ensure_tools() {
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "twinkle needs Python 3.11 or newer; '$PYTHON' is $("$PYTHON" -V 2>&1)." >&2
    echo "Run again with PYTHON=/path/to/python3.11 (or newer)." >&2
    exit 2
  fi
  # Environments of the scripts before nox (scripts/env.sh marked them with .stamp).
  local old
  for old in core-installed dingtalk docs lint local ray full; do
    if [ -f "$VENVS/$old/.stamp" ]; then
      log "removing $VENVS/$old (made by the old scripts/env.sh; nox's environments are in .nox/)"
      rm -rf "${VENVS:?}/$old"
    fi
  done
  local want="${TOOLS_REQUIREMENTS[*]} $("$PYTHON" -c 'import sys; print(sys.executable)')"
  if [ -x "$NOX" ] && [ "$(cat "$TOOLS/.requirements" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  log "setting up $TOOLS: ${TOOLS_REQUIREMENTS[*]} (about 10 s)"
  rm -rf "$TOOLS"
  "$PYTHON" -m venv "$TOOLS"
  quiet_pip "$TOOLS/bin/python" -m pip install -q --disable-pip-version-check "${TOOLS_REQUIREMENTS[@]}"
  echo "$want" > "$TOOLS/.requirements"
}
