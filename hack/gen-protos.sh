#!/usr/bin/env bash
# Regenerate the Python stubs of every rose_common/proto/*.proto with grpcio-tools from the venv.
#
#   hack/gen-protos.sh            # write *_pb2.py, *_pb2.pyi, *_pb2_grpc.py next to the .proto files
#   hack/gen-protos.sh OUT_ROOT   # write them under OUT_ROOT/rose_common/proto/ instead (currency check)
#
# The include root is the repository root, so generated imports read
# `from rose_common.proto import x_pb2` and work as `rose_common.proto.x_pb2`.
# Env: PYTHON (default: <repo>/.venv/bin/python).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
out="${1:-$repo}"
mkdir -p "$out/rose_common/proto"
cd "$repo"
shopt -s nullglob
protos=(rose_common/proto/*.proto)
if [ ${#protos[@]} -eq 0 ]; then
  echo "gen-protos: no .proto files under rose_common/proto" >&2
  exit 1
fi
"$python" -m grpc_tools.protoc -I . \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" "${protos[@]}"
echo "gen-protos: generated ${#protos[@]} file(s) into $out/rose_common/proto"
