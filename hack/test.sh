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
# With no arguments, three lanes at once: the e2e tier in two halves by folder (each with its own
# local cluster; mostly waiting on their processes), and the unit and contract tiers (no cluster)
# niced beside them; the second and third lanes' output is shown when all are done.
# ROSE_TEST_LANES=1, or any pytest argument, runs one pytest over what is asked.
E2E_A=(benchmarks elastic_controller rose_sdk rose_sim timeslice)  # the rest of tests/e2e: lane B
set +e
if [ $# -eq 0 ] && [ "${ROSE_TEST_LANES:-3}" != 1 ]; then
  lane_dir="$(mktemp -d)"
  a_paths=() b_ignores=()
  for f in "${E2E_A[@]}"; do a_paths+=("tests/e2e/$f"); b_ignores+=("--ignore=tests/e2e/$f"); done
  nice -n 5 pytest -m "not device" -p no:cacheprovider --durations=15 --basetemp="$lane_dir/uc" \
    tests/unit tests/contract >"$lane_dir/uc.log" 2>&1 &
  uc=$!
  pytest -m "not device" -p no:cacheprovider --durations=15 --basetemp="$lane_dir/b" \
    tests/e2e "${b_ignores[@]}" >"$lane_dir/b.log" 2>&1 &
  b=$!
  pytest -m "not device" -p no:cacheprovider --durations=15 "${a_paths[@]}"
  rc_a=$?
  wait "$b"
  rc_b=$?
  wait "$uc"
  rc_uc=$?
  echo "== e2e tier, lane B (ran beside lane A)"
  cat "$lane_dir/b.log"
  echo "== unit and contract tiers (ran beside the e2e tier)"
  cat "$lane_dir/uc.log"
  rm -rf "$lane_dir"
  echo "== exit: e2e lane A $rc_a, e2e lane B $rc_b, unit and contract $rc_uc"
  for rc in $rc_a $rc_b $rc_uc; do
    if [ "$rc" -eq 5 ]; then echo "error: a lane collected no tests" >&2; exit 1; fi
  done
  for rc in $rc_a $rc_b $rc_uc; do [ "$rc" -ne 0 ] && exit "$rc"; done
  exit 0
fi
pytest -m "not device" -p no:cacheprovider --durations=25 "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi
exit $rc
