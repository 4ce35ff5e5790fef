#!/usr/bin/env bash
# The rose-sdk wheel (sdk/pyproject.toml: rose_sdk and the few shared modules it imports, nothing of
# the control plane) into dist/, for RL images:
#   hack/build-sdk.sh [OUT_DIR]        # default dist/; prints the wheel's path
#   pip install dist/rose_sdk-<version>-py3-none-any.whl          # or '...whl[torch]', '...whl[s3]'
# Needs Python >= 3.11 with pip, and PyPI (or a mirror) for the build backend (setuptools).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/dist}"
PY=${PYTHON:-python3}
[ -x "$ROOT/.venv/bin/python" ] && [ -z "${PYTHON:-}" ] && PY="$ROOT/.venv/bin/python"
mkdir -p "$OUT"
# setuptools builds in sdk/build and copies all of it into the wheel: a module left there by an
# earlier build would ship too, so every build starts clean (both are git-ignored).
clean() { rm -rf "$ROOT/sdk/build" "$ROOT/sdk/rose_sdk.egg-info"; }
clean
trap clean EXIT
"$PY" -m pip wheel --quiet --no-deps --wheel-dir "$OUT" "$ROOT/sdk" >&2
VERSION="$(sed -n 's/^version = "\([^"]*\)".*/\1/p' "$ROOT/sdk/pyproject.toml" | head -n1)"
WHEEL="$OUT/rose_sdk-$VERSION-py3-none-any.whl"
[ -f "$WHEEL" ] || { echo "build-sdk: error: pip made no $WHEEL" >&2; exit 1; }
echo "$WHEEL"
