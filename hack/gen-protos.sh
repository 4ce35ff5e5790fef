#!/usr/bin/env bash
# Regenerate the Python stubs of every rose_common/proto/*.proto with grpcio-tools from the venv.
#
#   hack/gen-protos.sh            # write *_pb2.py, *_pb2.pyi, *_pb2_grpc.py next to the .proto files
#   hack/gen-protos.sh OUT_ROOT   # write them under OUT_ROOT/rose_common/proto/ instead
#   hack/gen-protos.sh --check    # exit 1 (naming the files) when the checked-in stubs are stale
#
# The include root is the repository root, so generated imports read
# `from rose_common.proto import x_pb2` and work as `rose_common.proto.x_pb2`.
# Env: PYTHON (default: <repo>/.venv/bin/python).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
cd "$repo"
shopt -s nullglob
protos=(rose_common/proto/*.proto)
if [ ${#protos[@]} -eq 0 ]; then
  echo "gen-protos: no .proto files under rose_common/proto" >&2
  exit 1
fi

generate() {
  mkdir -p "$1/rose_common/proto"
  "$python" -m grpc_tools.protoc -I . \
    --python_out="$1" --pyi_out="$1" --grpc_python_out="$1" "${protos[@]}"
}

if [ "${1:-}" = "--check" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  generate "$tmp"
  stale=()
  for p in "${protos[@]}"; do
    stem="${p%.proto}"
    for suffix in _pb2.py _pb2.pyi _pb2_grpc.py; do
      if ! cmp -s "$tmp/$stem$suffix" "$stem$suffix"; then stale+=("$stem$suffix"); fi
    done
  done
  if [ ${#stale[@]} -gt 0 ]; then
    echo "gen-protos: stale generated stubs: ${stale[*]}; run hack/gen-protos.sh and commit the result" >&2
    exit 1
  fi
  echo "gen-protos: ${#protos[@]} proto file(s), stubs current"
  exit 0
fi

out="${1:-$repo}"
generate "$out"
echo "gen-protos: generated ${#protos[@]} file(s) into $out/rose_common/proto"
