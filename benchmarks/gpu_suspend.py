"""GPU suspend / resume benchmark for ROSE (run on a GPU machine, e.g. one H200).

For each size (default 1, 8 and 32 GiB of device state) it measures, in one run:

* pinned ``cudaMemcpy`` bandwidth, device→host and host→device (one reused pinned buffer, CUDA
  events) — the ceiling;
* the ``cooperative`` backend (rose_sdk.CooperativeOffloader: reused pinned arena, non_blocking
  copies on a side stream, one sync): suspend (offload + free device memory) and resume, cold (first
  cycle, includes pinning the arena) and warm (arena reused), bit-exact check against a device copy;
* the ``cuda-checkpoint`` backend (dra_driver.suspend.cuda_checkpoint via ctypes, cuInit once in
  this long-lived process) on a child process holding the state: lock+checkpoint and
  restore+unlock, device-memory release check, bit-exact check by position-sensitive checksums.

It reports GB/s (1 GB = 1e9 B), the ratio to pinned memcpy, and the bit-exact results as JSON on
stdout (and to --out). The goal ROSE states: cooperative >= 0.8 x pinned memcpy.

    python -m benchmarks.gpu_suspend --sizes-gib 1,8,32 --out gpu_suspend.json

Without a CUDA GPU it exits with status 2 and says so. cuda-checkpoint needs driver r570+, the
process's PID namespace and root or CAP_SYS_PTRACE; persistence mode (nvidia-smi -pm 1) helps restore.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

GiB = 1 << 30
CHUNK = 256 << 20  # tensors of 256 MiB: a model-like set of many large tensors


def checksum(t: Any, chunk_elems: int = 1 << 25) -> tuple[int, int]:
    """Position-sensitive checksum of a uint8 tensor on any device: (Σ w, Σ w·(i+1)) over int64 words."""
    import torch

    words = t.view(torch.int64)
    s1 = torch.zeros((), dtype=torch.int64, device=t.device)
    s2 = torch.zeros((), dtype=torch.int64, device=t.device)
    for off in range(0, words.numel(), chunk_elems):
        w = words[off : off + chunk_elems]
        idx = torch.arange(off + 1, off + 1 + w.numel(), dtype=torch.int64, device=t.device)
        s1 += w.sum()
        s2 += (w * idx).sum()
    return int(s1.item()), int(s2.item())


def fill(n: int, seed: int, device: str) -> Any:
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device=device, generator=g)


def release_memory() -> None:
    """Free cached device blocks and torch's cached pinned host blocks between phases."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    host_empty = getattr(torch._C, "_host_emptyCache", None)
    if host_empty is not None:
        host_empty()


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / 1e9 / seconds if seconds > 0 else float("inf")


# ---------------------------------------------------------------------- pinned memcpy


def bench_memcpy(nbytes: int, repeats: int) -> dict[str, Any]:
    import torch

    dev = fill(nbytes, 1, "cuda")
    t0 = time.perf_counter()
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pin_s = time.perf_counter() - t0
    d2h, h2d = [], []
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    for _ in range(repeats):
        torch.cuda.synchronize()
        start.record()
        host.copy_(dev, non_blocking=True)
        end.record()
        end.synchronize()
        d2h.append(start.elapsed_time(end) / 1000)
        start.record()
        dev.copy_(host, non_blocking=True)
        end.record()
        end.synchronize()
        h2d.append(start.elapsed_time(end) / 1000)
    del dev, host
    release_memory()
    return {
        "pin_alloc_seconds": pin_s,
        "d2h_seconds": min(d2h),
        "h2d_seconds": min(h2d),
        "d2h_gbps": gbps(nbytes, min(d2h)),
        "h2d_gbps": gbps(nbytes, min(h2d)),
        "d2h_gbps_median": gbps(nbytes, statistics.median(d2h)),
        "h2d_gbps_median": gbps(nbytes, statistics.median(h2d)),
    }


# ---------------------------------------------------------------------- cooperative


def bench_cooperative(nbytes: int, repeats: int) -> dict[str, Any]:
    import torch

    from rose_sdk.offload import CooperativeOffloader

    n_chunks = max(1, nbytes // CHUNK)
    sizes = [CHUNK] * (n_chunks - 1) + [nbytes - CHUNK * (n_chunks - 1)]
    tensors = {f"t{i}": fill(s, 100 + i, "cuda") for i, s in enumerate(sizes)}
    reference = {k: v.clone() for k, v in tensors.items()}  # stays on the device, not offloaded
    off = CooperativeOffloader(tensors=tensors, device=torch.device("cuda", torch.cuda.current_device()))
    cycles = []
    bit_exact = True
    for i in range(repeats + 1):  # cycle 0 is cold (pins the arena)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        rep = off.offload()
        s = time.perf_counter() - t0
        freed = before - torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        back = off.restore()
        torch.cuda.synchronize()
        r = time.perf_counter() - t0
        exact = all(torch.equal(tensors[k], reference[k]) for k in tensors)
        bit_exact = bit_exact and exact
        cycles.append(
            {
                "cycle": i,
                "suspend_seconds": s,
                "resume_seconds": r,
                "bytes": rep.bytes_moved,
                "resumed_bytes": back.bytes_moved,
                "device_bytes_freed": freed,
                "arena_reused": rep.arena_reused,
                "bit_exact": exact,
            }
        )
    warm = cycles[1:] or cycles
    best_s = min(c["suspend_seconds"] for c in warm)
    best_r = min(c["resume_seconds"] for c in warm)
    del tensors, reference, off
    release_memory()
    return {
        "tensors": len(sizes),
        "cold_suspend_seconds": cycles[0]["suspend_seconds"],
        "suspend_seconds": best_s,
        "resume_seconds": best_r,
        "suspend_gbps": gbps(nbytes, best_s),
        "resume_gbps": gbps(nbytes, best_r),
        "device_memory_freed": all(c["device_bytes_freed"] >= nbytes for c in cycles),
        "bit_exact": bit_exact,
        "cycles": cycles,
    }


# ---------------------------------------------------------------------- cuda-checkpoint


def child_main(nbytes: int, seed: int) -> int:
    """The process whose state cuda-checkpoint moves: allocate, report checksum, verify on request."""
    import torch

    x = fill(nbytes, seed, "cuda")
    torch.cuda.synchronize()
    print(json.dumps({"ready": True, "pid": os.getpid(), "checksum": checksum(x)}), flush=True)
    for line in sys.stdin:
        if line.strip() == "verify":
            print(json.dumps({"checksum": checksum(x)}), flush=True)
        elif line.strip() == "exit":
            return 0
    return 0


def _device_free_bytes() -> int:
    import torch

    free, _ = torch.cuda.mem_get_info()
    return int(free)


def bench_cuda_checkpoint(nbytes: int, repeats: int, driver: Any) -> dict[str, Any]:
    from dra_driver.suspend.cuda_checkpoint import PROCESS_STATE_CHECKPOINTED, PROCESS_STATE_RUNNING

    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.gpu_suspend", "--child", "--child-bytes", str(nbytes)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        hello = json.loads(child.stdout.readline())
        pid, want = hello["pid"], tuple(hello["checksum"])
        cycles = []
        bit_exact = True
        for i in range(repeats):
            free0 = _device_free_bytes()
            t0 = time.perf_counter()
            driver.lock(pid, 60_000)
            driver.checkpoint(pid)
            s = time.perf_counter() - t0
            state = driver.get_state(pid)
            freed = _device_free_bytes() - free0
            t0 = time.perf_counter()
            driver.restore(pid)
            driver.unlock(pid)
            r = time.perf_counter() - t0
            child.stdin.write("verify\n")
            child.stdin.flush()
            got = tuple(json.loads(child.stdout.readline())["checksum"])
            exact = got == want
            bit_exact = bit_exact and exact
            cycles.append(
                {
                    "cycle": i,
                    "suspend_seconds": s,
                    "resume_seconds": r,
                    "state_after_checkpoint": state,
                    "checkpointed": state == PROCESS_STATE_CHECKPOINTED,
                    "device_bytes_freed": freed,
                    "running_after_resume": driver.get_state(pid) == PROCESS_STATE_RUNNING,
                    "bit_exact": exact,
                }
            )
        best_s = min(c["suspend_seconds"] for c in cycles)
        best_r = min(c["resume_seconds"] for c in cycles)
        return {
            "suspend_seconds": best_s,
            "resume_seconds": best_r,
            "suspend_gbps": gbps(nbytes, best_s),
            "resume_gbps": gbps(nbytes, best_r),
            "device_memory_freed": all(c["device_bytes_freed"] >= nbytes * 0.95 for c in cycles),
            "bit_exact": bit_exact,
            "cycles": cycles,
        }
    finally:
        with contextlib.suppress(Exception):
            child.stdin.write("exit\n")
            child.stdin.flush()
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_suspend", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--sizes-gib", default="1,8,32", help="comma-separated state sizes in GiB (fractions ok)")
    p.add_argument("--repeats", type=int, default=3, help="measured cycles per size and method")
    p.add_argument("--backends", default="cooperative,cuda-checkpoint", help="which backends to measure")
    p.add_argument("--libcuda", default="libcuda.so.1")
    p.add_argument("--out", default="", help="also write the JSON here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child_main(args.child_bytes, seed=4242)

    import torch

    if not torch.cuda.is_available():
        print(
            "gpu_suspend: no CUDA GPU is visible (torch.cuda.is_available() is False; "
            f"torch {torch.__version__}, CUDA build {torch.version.cuda}). This benchmark needs an NVIDIA GPU "
            "with its driver; run it on the GPU machine (e.g. the H200).",
            file=sys.stderr,
        )
        return 2
    sizes = [float(s) for s in args.sizes_gib.split(",") if s.strip()]
    backends = {b.strip() for b in args.backends.split(",") if b.strip()}
    props = torch.cuda.get_device_properties(0)
    result: dict[str, Any] = {
        "device": props.name,
        "device_memory_bytes": props.total_memory,
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "host": platform.node(),
        "started_unix": time.time(),
        "sizes": [],
    }
    driver = None
    if "cuda-checkpoint" in backends:
        from dra_driver.suspend.cuda_checkpoint import CudaCheckpointUnavailable, CudaDriver

        try:
            driver = CudaDriver.load(args.libcuda)
            driver.init()
            result["driver_api_version"] = driver.driver_version()
        except CudaCheckpointUnavailable as e:
            result["cuda_checkpoint_unavailable"] = str(e)
    for gib in sizes:
        nbytes = int(gib * GiB) // 8 * 8
        entry: dict[str, Any] = {"gib": gib, "bytes": nbytes}
        print(f"gpu_suspend: {gib} GiB ...", file=sys.stderr, flush=True)
        entry["pinned_memcpy"] = bench_memcpy(nbytes, args.repeats)
        ref_d2h, ref_h2d = entry["pinned_memcpy"]["d2h_gbps"], entry["pinned_memcpy"]["h2d_gbps"]
        if "cooperative" in backends:
            try:
                c = bench_cooperative(nbytes, args.repeats)
                c["suspend_ratio_to_pinned_d2h"] = c["suspend_gbps"] / ref_d2h
                c["resume_ratio_to_pinned_h2d"] = c["resume_gbps"] / ref_h2d
                entry["cooperative"] = c
            except Exception as e:
                entry["cooperative"] = {"error": repr(e)}
        if driver is not None:
            try:
                k = bench_cuda_checkpoint(nbytes, args.repeats, driver)
                k["suspend_ratio_to_pinned_d2h"] = k["suspend_gbps"] / ref_d2h
                k["resume_ratio_to_pinned_h2d"] = k["resume_gbps"] / ref_h2d
                entry["cuda_checkpoint"] = k
            except Exception as e:
                entry["cuda_checkpoint"] = {"error": repr(e)}
        result["sizes"].append(entry)
        release_memory()
    coop = [e["cooperative"] for e in result["sizes"] if "suspend_gbps" in e.get("cooperative", {})]
    result["goal"] = {
        "cooperative_min_ratio": 0.8,
        "met": bool(coop)
        and all(
            c["suspend_ratio_to_pinned_d2h"] >= 0.8 and c["resume_ratio_to_pinned_h2d"] >= 0.8 and c["bit_exact"]
            for c in coop
        ),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
