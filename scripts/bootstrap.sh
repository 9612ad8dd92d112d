#!/usr/bin/env bash
# Set up .venv/ (Python 3.11) with the patched torch wheel (the release that
# patches/series names, built from the official wheel), this project, pytest,
# expecttest, hypothesis, the redis client and tlparse, and Debian's redis-server
# where it can (below).  Idempotent: when patches/ and torch_overlay/ are
# what the installed torch was built from, it only checks.  The first set-up
# of a release downloads its wheel and torch's dependencies (for 2.15.0 the
# CUDA build and its CUDA packages, about 5 GB, which import and run on a
# machine without a GPU); later runs download nothing.  When pip refuses
# that release (a constraints file capping torch, in pip's configuration or
# PIP_CONSTRAINT), it says which constraint, where it is configured, and the
# remedy (torch_patch_stack/pip_constraints.py).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
venv=$repo/.venv
log() { printf 'bootstrap: %s\n' "$*" >&2; }

python_bin=${PYTHON:-}
if [ -z "$python_bin" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      python_bin=$(command -v "$candidate"); break
    fi
  done
fi
if [ -z "$python_bin" ]; then
  log "Python 3.11 is required (the torch wheels the stack is built from are cp311); set PYTHON=/path/to/python3.11"
  exit 1
fi

if [ ! -x "$venv/bin/python" ]; then
  log "creating $venv with $python_bin"
  "$python_bin" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)

want=$("$python_bin" -c 'import sys; sys.path.insert(0, sys.argv[1]); from torch_patch_stack import series; from pathlib import Path; r = Path(sys.argv[1]); print(series.stack_digest(r / "patches", r / "torch_overlay"))' "$repo")
base=$("$python_bin" -c 'import sys; sys.path.insert(0, sys.argv[1]); from torch_patch_stack import series; from pathlib import Path; print(series.read_base(Path(sys.argv[1]) / "patches"))' "$repo")

# pip install the patched wheel; when pip refuses it, say why (pip's own
# message names neither the constraint nor where it is configured).
install_torch() {
  local errors status=0
  errors=$(mktemp)
  "${pip[@]}" install "$@" 2>"$errors" || status=$?
  cat "$errors" >&2
  if [ "$status" -ne 0 ] && grep -q "No space left on device" "$errors"; then
    log "pip ran out of disk space; torch and its CUDA packages need about 8 GB free:"
    df -h "$venv" "${TMPDIR:-/tmp}" >&2 || true
    rm -f "$errors"
    exit "$status"
  fi
  if [ "$status" -ne 0 ]; then
    "$python_bin" -m torch_patch_stack.pip_constraints --python "$venv/bin/python" \
      --version "$base" <"$errors" | sed 's/^/bootstrap: /' >&2
    rm -f "$errors"
    exit "$status"
  fi
  rm -f "$errors"
}
have=$("$venv/bin/python" scripts/patchstack.py status --json 2>/dev/null | "$python_bin" -c 'import json, sys; print(json.load(sys.stdin)["digest"])' 2>/dev/null || true)

if [ "$want" != "$have" ]; then
  log "building the patched torch wheel (patches/ + torch_overlay/ changed or not installed)"
  wheel=$("$python_bin" scripts/patchstack.py build)
  log "installing $(basename "$wheel")"
  install_torch --no-deps --force-reinstall "$wheel"
  install_torch "$wheel"  # torch's own dependencies, if missing
else
  log "patched torch is up to date (stack ${want:0:16})"
fi

stamp=$venv/.project-deps
deps_digest=$(cat setup.py | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$deps_digest" ]; then
  log "installing the project and test tools"
  "${pip[@]}" install -e "$repo[test]"
  echo "$deps_digest" > "$stamp"
fi
"$venv/bin/python" scripts/patchstack.py status >/dev/null || {
  log "the installed torch does not carry the current patch stack"; exit 1; }

# The shared-cache tests run jobs against a real Redis server (Debian's
# redis-server, on a loopback port of their own), as Inductor's remote caches
# use it.  Installed where this script may (root, apt); elsewhere those tests
# skip and name what is missing.
if ! command -v redis-server >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing redis-server (Debian's package) for the shared-cache tests"
    apt_log=$(mktemp)
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends redis-server; } >"$apt_log" 2>&1; then
      log "could not install redis-server (the shared-cache tests will skip):"
      tail -n 5 "$apt_log" >&2
    fi
    rm -f "$apt_log"
  else
    log "redis-server is not installed and this is not root with apt: the shared-cache tests will skip"
  fi
fi
