#!/usr/bin/env bash
# The whole GPU check of the suspend path in one command, within 10 minutes: its steps' timeouts add up to
# 15 + 45 + 180 + 80 + 170 + 50 = 540 s, which leaves a minute of the ten for start-up (checked by
# tests/unit/repo/test_device_check_budget.py):
#   1. environment: nvidia-smi (GPU, driver version, persistence mode), torch + CUDA, protobuf, grpc;
#   2. the device tier (tests/device): each backend checkpointed, device memory freed, bit-exact,
#      Adam training on the GPU suspended/resumed by each backend, bit-identical; the rollout engines
#      (test_rollout_engines.py: Transformers generate, vLLM, SGLang slept, woken, reloaded; vLLM and
#      SGLang skip, saying so, where they are not installed: its own step, 2b, at most 80 s);
#   3. python -m benchmarks.gpu_suspend --sizes-gib 1,8,32 --json OUT/gpu_suspend.json (at most 170 s; no
#      size starts after 100 s);
#   3b. python -m benchmarks.spill --sizes-mib 256,1024 --repeats 2 --json OUT/spill.json (the disk tier
#      of suspended state on this machine's disk and CPU, at most 50 s; the GPU staging path is in step 2).
# Usage: hack/device-check.sh [OUT_DIR]   (default: $OUT, else out/device-check)
# Exit status: 0 all passed; 2 no usable GPU here (says what was found); 1 a test or the benchmark failed.
# Changes no GPU setting (persistence mode is recorded, not set).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-out/device-check}}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" CUBLAS_WORKSPACE_CONFIG=:4096:8
LOG="$OUT_DIR/device-check.log"
: >"$LOG"
say() { echo "device-check: $*" | tee -a "$LOG" >&2; }
status=0

say "1/3 environment (output in $OUT_DIR/env.txt)"
{
  date -u
  if command -v nvidia-smi >/dev/null; then
    timeout 15 nvidia-smi --query-gpu=index,name,driver_version,memory.total,persistence_mode,pcie.link.gen.max,pcie.link.width.max --format=csv
  else
    echo "nvidia-smi: not found"
  fi
  timeout 45 "$PY" - <<'PYEOF'
import importlib, sys
print("python", sys.version.split()[0])
for mod in ("torch", "google.protobuf", "grpc", "numpy"):
    try:
        m = importlib.import_module(mod)
        print(mod, getattr(m, "__version__", "?"))
    except Exception as e:
        print(mod, "NOT IMPORTABLE:", e)
import torch
print("torch.version.cuda", torch.version.cuda, "cuda available", torch.cuda.is_available(),
      "devices", torch.cuda.device_count())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device0", p.name, p.total_memory)
PYEOF
} >"$OUT_DIR/env.txt" 2>&1
cat "$OUT_DIR/env.txt" >>"$LOG"
if ! grep -q "cuda available True" "$OUT_DIR/env.txt"; then
  say "no usable NVIDIA GPU on this machine: $(grep -E 'nvidia-smi|cuda available|NOT IMPORTABLE' "$OUT_DIR/env.txt" | tr '\n' ';')"
  say "run this script on a GPU machine (device tests and benchmark skipped)"
  exit 2
fi

say "2/3 device tests (tests/device but the rollout engines, at most 200 s)"
timeout 180 "$PY" -m pytest tests/device -v -p no:cacheprovider --junitxml="$OUT_DIR/device-tests.xml" \
  --ignore=tests/device/rose_sdk/test_rollout_engines.py >"$OUT_DIR/device-tests.txt" 2>&1
rc=$?
tail -n 30 "$OUT_DIR/device-tests.txt" | tee -a "$LOG" >&2
[ $rc -eq 0 ] || { say "device tests failed (status $rc; 124 = timed out)"; status=1; }

say "2b/3 rollout engines (tests/device/rose_sdk/test_rollout_engines.py, at most 80 s; vLLM / SGLang skip if not installed)"
timeout 80 "$PY" -m pytest tests/device/rose_sdk/test_rollout_engines.py -v -rs -p no:cacheprovider \
  --junitxml="$OUT_DIR/rollout-engines.xml" >"$OUT_DIR/rollout-engines.txt" 2>&1
rc=$?
tail -n 20 "$OUT_DIR/rollout-engines.txt" | tee -a "$LOG" >&2
[ $rc -eq 0 ] || { say "rollout-engine tests failed (status $rc; 124 = timed out)"; status=1; }

say "3/3 benchmark 1, 8, 32 GiB (at most 200 s; no size starts after 120 s)"
timeout 170 "$PY" -m benchmarks.gpu_suspend --sizes-gib 1,8,32 --repeats 2 --time-limit-seconds 100 \
  --json "$OUT_DIR/gpu_suspend.json" >/dev/null 2>"$OUT_DIR/gpu_suspend.stderr"
rc=$?
tail -n 20 "$OUT_DIR/gpu_suspend.stderr" | tee -a "$LOG" >&2
[ $rc -eq 0 ] || { say "benchmark failed (status $rc; 124 = timed out)"; status=1; }
if [ -s "$OUT_DIR/gpu_suspend.json" ]; then
  "$PY" - "$OUT_DIR/gpu_suspend.json" <<'PYEOF' | tee -a "$LOG" >&2
import json, sys
r = json.load(open(sys.argv[1]))
for e in r["sizes"]:
    m = e["pinned_memcpy"]
    line = [f"{e['gib']:g} GiB: pinned d2h {m['d2h_gbps']:.1f} h2d {m['h2d_gbps']:.1f} GB/s"]
    for k in ("cooperative", "cuda_checkpoint"):
        b = e.get(k, {})
        if "suspend_gbps" in b:
            line.append(f"{k} {b['suspend_gbps']:.1f}/{b['resume_gbps']:.1f} GB/s"
                        f" (x{b['suspend_ratio_to_pinned_d2h']:.2f}/x{b['resume_ratio_to_pinned_h2d']:.2f})"
                        f" freed={b['device_memory_freed']} exact={b['bit_exact']}")
        elif b:
            line.append(f"{k} ERROR {b.get('error')}")
    print("; ".join(line))
print("goal:", json.dumps(r["goal"]))
print("skipped sizes:", r.get("skipped_sizes_gib"), "unavailable:", r.get("cuda_checkpoint_unavailable"))
PYEOF
fi
say "3b/3 disk tier: spill and restore bandwidth (benchmarks.spill, at most 60 s)"
timeout 50 "$PY" -m benchmarks.spill --sizes-mib 256,1024 --repeats 2 --json "$OUT_DIR/spill.json" \
  >/dev/null 2>"$OUT_DIR/spill.stderr"
rc=$?
tail -n 5 "$OUT_DIR/spill.stderr" | tee -a "$LOG" >&2
[ $rc -eq 0 ] || { say "spill benchmark failed (status $rc; 124 = timed out)"; status=1; }
if [ -s "$OUT_DIR/spill.json" ]; then
  "$PY" - "$OUT_DIR/spill.json" <<'PYEOF' | tee -a "$LOG" >&2
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(f"disk tier {r['size_mib']} MiB: spill {r['spill_gbps']} GB/s, cold restore {r['restore_cold_gbps']} GB/s,"
          f" plain write+fsync {r['baseline_write_fsync_gbps']} GB/s, exact={r['bit_exact']}")
PYEOF
fi
say "done, status $status; files in $OUT_DIR"
exit $status
