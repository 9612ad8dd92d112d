#!/usr/bin/env bash
# Run the test suite in .venv (set up first by bootstrap.sh).  Extra arguments go
# to pytest, e.g. ./scripts/test.sh -k 2Ranks  or  ./scripts/test.sh test/tools
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
exec .venv/bin/python -m pytest -ra "$@"
