# Shared set-up helpers for scripts/*.sh: one virtualenv per purpose under .venvs/, created and
# filled only when what it should hold changed, so running a script again is fast.
# shellcheck shell=bash

PYTHON="${PYTHON:-python3}"
VENVS="${TWINKLE_VENVS:-$PWD/.venvs}"
# torch is pinned here (and only here): 2.13.0 is the CPU build this project tests with.
# Users elsewhere keep their own torch; the packages only ask for torch>=2.2.
TORCH_SPEC="${TWINKLE_TORCH_SPEC:-torch==2.13.0}"
# Elsewhere, point this at PyTorch's CPU wheel index to avoid downloading a CUDA build.
TORCH_INDEX=()
if [ -n "${TWINKLE_TORCH_INDEX_URL:-}" ]; then
  TORCH_INDEX=(--extra-index-url "$TWINKLE_TORCH_INDEX_URL")
fi
DEV_DEPS=(pytest hypothesis ruff "setuptools>=70" wheel)

log() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# ensure_env NAME [--torch] [--installed] PACKAGE_DIR... [-- EXTRA_REQUIREMENT...]
# Creates .venvs/NAME with the given twinkle packages installed in editable mode (with
# --installed: built and installed as a user would, re-installed when a source file changes),
# the dev tools and, with --torch, the pinned CPU torch. Silent when already up to date.
ensure_env() {
  local name=$1; shift
  local torch=no installed=no pkgs=() extra=()
  if [ "${1:-}" = --torch ]; then torch=yes; shift; fi
  if [ "${1:-}" = --installed ]; then installed=yes; shift; fi
  while [ $# -gt 0 ] && [ "$1" != -- ]; do pkgs+=("$1"); shift; done
  if [ "${1:-}" = -- ]; then shift; extra=("$@"); fi
  local venv="$VENVS/$name" stamp
  stamp=$( { echo "$torch ${pkgs[*]} ${extra[*]} ${DEV_DEPS[*]} $TORCH_SPEC"; \
             for p in "${pkgs[@]}"; do cat "$p/pyproject.toml"; done
             if [ "$installed" = yes ]; then
               find "${pkgs[@]}" -name '*.py' -not -path '*/build/*' | sort | xargs cat
             fi; } | sha256sum | cut -c1-16)
  if [ -f "$venv/.stamp" ] && [ "$(cat "$venv/.stamp")" = "$stamp" ]; then
    return 0
  fi
  log "setting up $venv"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  local pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" --upgrade pip >/dev/null
  "${pip[@]}" "${DEV_DEPS[@]}" "${extra[@]}"
  local torch_req=()
  if [ "$torch" = yes ]; then torch_req=("$TORCH_SPEC"); fi
  "${pip[@]}" "${TORCH_INDEX[@]}" "${DEV_DEPS[@]}" "${extra[@]}" "${torch_req[@]}"
  local args=()
  if [ "$installed" = yes ]; then
    "${pip[@]}" --force-reinstall --no-deps "${pkgs[@]}"
    "${pip[@]}" "${pkgs[@]}" "${torch_req[@]}"
  else
    for p in "${pkgs[@]}"; do args+=(-e "$p"); done
    # compat mode puts each package folder on sys.path, so `import twinkle_core` finds the real
    # package even when the repository root (holding the twinkle_core/ folder) is the cwd.
    "${pip[@]}" --config-settings editable_mode=compat "${args[@]}" "${torch_req[@]}"
  fi
  echo "$stamp" > "$venv/.stamp"
}
