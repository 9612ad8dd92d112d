#!/usr/bin/env bash
# Lint the repository as upstream PyTorch lints torch/: ruff format --check,
# ruff check, flake8 (with upstream's plugins) and mypy, at the versions pinned
# in scripts/lint-requirements.txt, configured by ruff.toml, .flake8 and
# mypy.ini (each says where it deviates from upstream and why); then the
# import graph of the overlay modules: no cycles, no imports inside functions,
# beyond those scripts/import-baseline.txt lists (scripts/check_imports.py).
#
#   ./scripts/lint.sh          check; exit 1 when any tool finds anything
#   ./scripts/lint.sh --fix    first apply ruff format and ruff's safe fixes
#
# The tools live in build/lint-venv (git-ignored), created with Python 3.11 and
# reinstalled only when scripts/lint-requirements.txt changes.  mypy checks the
# overlay modules against the patched torch of .venv/: run
# ./scripts/bootstrap.sh first (CI does).
set -euo pipefail
cd "$(dirname "$0")/.."

paths=(torch_overlay scripts torch_patch_stack test)
venv=build/lint-venv
requirements=scripts/lint-requirements.txt
log() { printf 'lint: %s\n' "$*" >&2; }

fix=0
case "${1:-}" in
  "") ;;
  --fix) fix=1 ;;
  *) log "usage: $0 [--fix]"; exit 2 ;;
esac

# --- the tools, at their pins ---------------------------------------------------
stamp=$venv/.requirements-digest
want=$(sha256sum "$requirements" | cut -c1-16)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python_bin=${PYTHON:-python3.11}
  if ! command -v "$python_bin" >/dev/null; then
    log "Python 3.11 is required for the lint tools; set PYTHON=/path/to/python3.11"
    exit 1
  fi
  log "installing the pinned lint tools into $venv"
  rm -rf "$venv"
  "$python_bin" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  "$venv/bin/python" -m pip check --disable-pip-version-check >/dev/null
  echo "$want" > "$stamp"
fi

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  log "mypy type-checks against the patched torch in .venv/: run ./scripts/bootstrap.sh first"
  exit 1
fi

if [ "$fix" = 1 ]; then
  "$venv/bin/ruff" format "${paths[@]}"
  "$venv/bin/ruff" check --fix "${paths[@]}"
fi

# --- the linters ----------------------------------------------------------------
failed=()
run() {
  local name=$1; shift
  local start=$SECONDS
  printf '== %s\n' "$name"
  if "$@"; then
    printf '   ok (%d s)\n' $((SECONDS - start))
  else
    printf '   FAILED: %s (%d s)\n' "$name" $((SECONDS - start))
    failed+=("$name")
  fi
}

start=$SECONDS
run "ruff format --check" "$venv/bin/ruff" format --check "${paths[@]}"
run "ruff check" "$venv/bin/ruff" check "${paths[@]}"
# flake8-logging-format imports pkg_resources, which warns on import.
run "flake8" env PYTHONWARNINGS="ignore:pkg_resources is deprecated:UserWarning" \
  "$venv/bin/flake8" "${paths[@]}"
# Files, torch and cache directory come from mypy.ini.
run "mypy" "$venv/bin/mypy"
# ast only: no torch needed.  Fails on a cycle or a function-local import of an
# overlay module that scripts/import-baseline.txt does not list, and on a line
# of it that no longer occurs (issue 32).
run "import graph" "$venv/bin/python" scripts/check_imports.py

if [ ${#failed[@]} -gt 0 ]; then
  log "FAILED: $(printf '%s; ' "${failed[@]}")($((SECONDS - start)) s)"
  log "'./scripts/lint.sh --fix' applies ruff format and ruff's safe fixes"
  exit 1
fi
log "clean ($((SECONDS - start)) s)"
