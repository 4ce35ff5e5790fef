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
# With no arguments, two lanes at once: the e2e tier (one shared local cluster, mostly waiting on
# its processes) in front, and the unit and contract tiers (no cluster) niced beside it, their
# output shown when both are done. ROSE_TEST_LANES=1, or any pytest argument, runs one pytest.
set +e
if [ $# -eq 0 ] && [ "${ROSE_TEST_LANES:-2}" != 1 ]; then
  lane_dir="$(mktemp -d)"
  nice -n 5 pytest -m "not device" -p no:cacheprovider --durations=15 --basetemp="$lane_dir/tmp" \
    tests/unit tests/contract >"$lane_dir/log" 2>&1 &
  lane=$!
  pytest -m "not device" -p no:cacheprovider --durations=25 tests/e2e
  rc_e2e=$?
  wait "$lane"
  rc_uc=$?
  echo "== unit and contract tiers (ran beside the e2e tier)"
  cat "$lane_dir/log"
  rm -rf "$lane_dir"
  echo "== exit: e2e $rc_e2e, unit and contract $rc_uc"
  if [ $rc_e2e -eq 5 ] || [ $rc_uc -eq 5 ]; then echo "error: a lane collected no tests" >&2; exit 1; fi
  [ $rc_e2e -ne 0 ] && exit $rc_e2e
  exit $rc_uc
fi
pytest -m "not device" -p no:cacheprovider --durations=25 "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi
exit $rc
