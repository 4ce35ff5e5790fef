#!/usr/bin/env bash
# The README's demo command: set up a fresh machine, then run `rose demo` on the embedded default.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash hack/setup.sh
exec .venv/bin/rose demo "$@"
