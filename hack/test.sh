#!/usr/bin/env bash
# The README's test command: set up a fresh machine, lint and type-check, then run every tier
# that can run here (unit, contract, e2e). A GPU-only tier (device) is deselected: no GPU here.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export ROSE_TRACES_DIR="${ROSE_TRACES_DIR:-$ROOT/../shared/data/traces}"
if [ ! -d "$ROSE_TRACES_DIR" ]; then
  echo "error: traces folder $ROSE_TRACES_DIR is missing (set ROSE_TRACES_DIR)" >&2
  exit 1
fi
bash hack/setup.sh
export PATH="$ROOT/.venv/bin:$PATH"

echo "== lint: ruff, mypy --strict, import-linter, function length, generated stubs current"
ruff check .
ruff format --check .
mypy
lint-imports
python hack/check-function-length.py
if [ -x hack/gen-protos.sh ]; then bash hack/gen-protos.sh --check; fi

echo "== tests: unit, contract, e2e"
set +e
pytest -m "not device" -p no:cacheprovider --durations=25 "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi
exit $rc
