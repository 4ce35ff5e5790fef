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

It reports GB/s (1 GB = 1e9 B) end to end (allocator free / malloc included) and copy-only, the
ratio to pinned memcpy, the bytes the driver really moved for cuda-checkpoint (NVML's used memory
of the child before the checkpoint), whether device memory was freed, and the bit-exact results, as
JSON on stdout (and to --json). The goals ROSE states, at 8 GiB and above (``goal_verdict``):
cooperative >= 0.8 x and cuda-checkpoint >= 0.5 x pinned memcpy, each bit-exact and with the device
memory freed — a no-op offload never meets a goal.

    python -m benchmarks.gpu_suspend --sizes-gib 1,8,32 --json gpu_suspend.json

Without a CUDA GPU it exits with status 2 and says so. cuda-checkpoint needs driver r570+, the
process's PID namespace and root or CAP_SYS_PTRACE; persistence mode (nvidia-smi -pm 1) helps restore.
Every read of the child's output has a timeout (a stuck child ends the size, not the run); a
failed checkpoint is unlocked at once; ``--time-limit-seconds`` skips the sizes left when spent.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

GiB = 1 << 30
CHUNK = 256 << 20  # tensors of 256 MiB: a model-like set of many large tensors
GOAL_MIN_GIB = 8.0  # the goals are judged at 8 GiB and above
COOPERATIVE_GOAL = 0.8
CUDA_CHECKPOINT_GOAL = 0.5
LOCK_TIMEOUT_MS = 60_000


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
                "suspend_copy_seconds": rep.copy_seconds,
                "resume_copy_seconds": back.copy_seconds,
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
    copy_s = min(c["suspend_copy_seconds"] for c in warm)
    copy_r = min(c["resume_copy_seconds"] for c in warm)
    del tensors, reference, off
    release_memory()
    return {
        "tensors": len(sizes),
        "cold_suspend_seconds": cycles[0]["suspend_seconds"],
        "suspend_seconds": best_s,
        "resume_seconds": best_r,
        "suspend_gbps": gbps(nbytes, best_s),
        "resume_gbps": gbps(nbytes, best_r),
        "suspend_copy_seconds": copy_s,
        "resume_copy_seconds": copy_r,
        "suspend_copy_gbps": gbps(nbytes, copy_s),
        "resume_copy_gbps": gbps(nbytes, copy_r),
        "device_memory_freed": all(c["device_bytes_freed"] >= nbytes for c in cycles),
        "bit_exact": bit_exact,
        "cycles": cycles,
    }


# ---------------------------------------------------------------------- cuda-checkpoint


def _maps_count(pid: int, needle: str) -> int:
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            return sum(needle in line for line in f)
    except OSError:
        return -1


def child_main(nbytes: int, seed: int) -> int:
    """The process whose state cuda-checkpoint moves: allocate, report checksum, verify on request."""
    import torch

    x = fill(nbytes, seed, "cuda")
    torch.cuda.synchronize()
    hello = {
        "ready": True,
        "pid": os.getpid(),
        "checksum": checksum(x),
        "maps_nvidia_uvm": _maps_count(os.getpid(), "/dev/nvidia-uvm"),
        "maps_libnccl": _maps_count(os.getpid(), "libnccl"),
    }
    print(json.dumps(hello), flush=True)
    for line in sys.stdin:
        if line.strip() == "verify":
            print(json.dumps({"checksum": checksum(x)}), flush=True)
        elif line.strip() == "exit":
            return 0
    return 0


class ChildTimeout(RuntimeError):
    """The child sent no line within the time allowed (stuck, or dead without closing its pipe)."""


class Child:
    """A child process speaking one JSON object per line; every read has a timeout."""

    def __init__(self, cmd: Sequence[str]) -> None:
        self.proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._pump, name="child-reader", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def read_json(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise ChildTimeout(f"child {self.proc.pid} sent nothing for {timeout:.0f}s") from None
        if line is None:
            raise ChildTimeout(f"child {self.proc.pid} exited (status {self.proc.poll()}) before answering")
        got: dict[str, Any] = json.loads(line)
        return got

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self, wait_seconds: float = 30.0) -> None:
        with contextlib.suppress(Exception):
            self.send("exit")
        try:
            self.proc.wait(timeout=wait_seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(Exception):
                if pipe is not None:
                    pipe.close()


def _suspend_child(driver: Any, pid: int) -> tuple[float, float]:
    """lock + checkpoint; a failed checkpoint is unlocked at once. Returns (lock, checkpoint) seconds."""
    t0 = time.perf_counter()
    driver.lock(pid, LOCK_TIMEOUT_MS)
    t1 = time.perf_counter()
    try:
        driver.checkpoint(pid)
    except Exception:
        with contextlib.suppress(Exception):
            driver.unlock(pid)
        raise
    return t1 - t0, time.perf_counter() - t1


def _ckpt_cycle(
    i: int, child: Child, pid: int, want: tuple[int, int], driver: Any, probe: Any, free_bytes: Callable[[], int]
) -> dict[str, Any]:
    from dra_driver.suspend.cuda_checkpoint import PROCESS_STATE_CHECKPOINTED, PROCESS_STATE_RUNNING

    moved = probe.process_device_bytes(pid) if probe is not None else None
    free0 = free_bytes()
    lock_s, ckpt_s = _suspend_child(driver, pid)
    state = driver.get_state(pid)
    freed = free_bytes() - free0
    t0 = time.perf_counter()
    driver.restore(pid)
    t1 = time.perf_counter()
    driver.unlock(pid)
    r = time.perf_counter() - t0
    child.send("verify")
    got = tuple(child.read_json(timeout=300)["checksum"])
    return {
        "cycle": i,
        "suspend_seconds": lock_s + ckpt_s,
        "lock_seconds": lock_s,
        "checkpoint_seconds": ckpt_s,
        "resume_seconds": r,
        "restore_seconds": t1 - t0,
        "driver_moved_bytes": moved,
        "state_after_checkpoint": state,
        "checkpointed": state == PROCESS_STATE_CHECKPOINTED,
        "device_bytes_freed": freed,
        "running_after_resume": driver.get_state(pid) == PROCESS_STATE_RUNNING,
        "bit_exact": got == want,
    }


def bench_cuda_checkpoint(
    nbytes: int,
    repeats: int,
    driver: Any,
    *,
    probe: Any = None,
    child_cmd: Sequence[str] | None = None,
    free_bytes: Callable[[], int] | None = None,
    ready_timeout: float = 300.0,
) -> dict[str, Any]:
    cmd = child_cmd or [sys.executable, "-m", "benchmarks.gpu_suspend", "--child", "--child-bytes", str(nbytes)]
    child = Child(cmd)
    healthy = False
    try:
        hello = child.read_json(timeout=ready_timeout)
        pid, want = hello["pid"], tuple(hello["checksum"])
        cycles = [
            _ckpt_cycle(i, child, pid, want, driver, probe, free_bytes or _device_free_bytes) for i in range(repeats)
        ]
        best = min(cycles, key=lambda c: c["suspend_seconds"])
        best_r = min(c["resume_seconds"] for c in cycles)
        moved = best["driver_moved_bytes"]
        healthy = True
        return {
            "suspend_seconds": best["suspend_seconds"],
            "checkpoint_seconds": best["checkpoint_seconds"],
            "resume_seconds": best_r,
            "suspend_gbps": gbps(nbytes, best["suspend_seconds"]),
            "checkpoint_gbps": gbps(nbytes, best["checkpoint_seconds"]),
            "resume_gbps": gbps(nbytes, best_r),
            "driver_moved_bytes": moved,
            "driver_moved_gbps": None if moved is None else gbps(moved, best["checkpoint_seconds"]),
            "checkpointed": all(c["checkpointed"] for c in cycles),
            "device_memory_freed": all(c["device_bytes_freed"] >= nbytes * 0.95 for c in cycles),
            "bit_exact": all(c["bit_exact"] for c in cycles),
            "child_maps_nvidia_uvm": hello.get("maps_nvidia_uvm"),
            "child_maps_libnccl": hello.get("maps_libnccl"),
            "cycles": cycles,
        }
    finally:
        child.close(30.0 if healthy else 2.0)  # a child that failed or stuck is not waited for long


def _device_free_bytes() -> int:
    import torch

    free, _ = torch.cuda.mem_get_info()
    return int(free)


# ---------------------------------------------------------------------- goal


def _judge(entries: list[tuple[float, dict[str, Any] | None]], goal: float) -> dict[str, Any]:
    why_not: list[str] = []
    judged = [(g, e) for g, e in entries if g >= GOAL_MIN_GIB]
    if not judged:
        why_not.append(f"no size >= {GOAL_MIN_GIB:g} GiB was measured")
    for gib, e in judged:
        if e is None or "error" in e or "suspend_gbps" not in e:
            why_not.append(f"{gib:g} GiB: not measured ({(e or {}).get('error', 'missing')})")
            continue
        if not e.get("device_memory_freed"):
            why_not.append(f"{gib:g} GiB: device memory not freed")
        if not e.get("bit_exact"):
            why_not.append(f"{gib:g} GiB: not bit-exact")
        for k in ("suspend_ratio_to_pinned_d2h", "resume_ratio_to_pinned_h2d"):
            if not e.get(k, 0.0) >= goal:
                why_not.append(f"{gib:g} GiB: {k} {e.get(k)} < {goal}")
    return {"min_ratio": goal, "min_gib": GOAL_MIN_GIB, "met": not why_not, "why_not": why_not}


def goal_verdict(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    """Pure: are the goals met? Each backend, at every size >= 8 GiB: device memory freed,
    bit-exact, both directions at least the goal's ratio to pinned memcpy."""
    coop = _judge([(e["gib"], e.get("cooperative")) for e in sizes], COOPERATIVE_GOAL)
    ckpt = _judge([(e["gib"], e.get("cuda_checkpoint")) for e in sizes], CUDA_CHECKPOINT_GOAL)
    return {"cooperative": coop, "cuda_checkpoint": ckpt, "met": coop["met"] and ckpt["met"]}


# ---------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu_suspend", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--sizes-gib", default="1,8,32", help="comma-separated state sizes in GiB (fractions ok)")
    p.add_argument("--repeats", type=int, default=3, help="measured cycles per size and method")
    p.add_argument("--backends", default="cooperative,cuda-checkpoint", help="which backends to measure")
    p.add_argument("--libcuda", default="libcuda.so.1")
    p.add_argument("--libnvml", default="libnvidia-ml.so.1")
    p.add_argument("--json", "--out", dest="json", default="", help="also write the JSON here")
    p.add_argument("--time-limit-seconds", type=float, default=0.0, help="skip the sizes left once spent (0 = none)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-bytes", type=int, default=0, help=argparse.SUPPRESS)
    return p


def _open_driver(args: argparse.Namespace, result: dict[str, Any]) -> tuple[Any, Any]:
    """(CudaDriver, NVML probe) for the cuda-checkpoint backend; the reason recorded when unavailable."""
    from dra_driver.suspend.cuda_checkpoint import CudaCheckpointUnavailable, CudaDriver
    from dra_driver.suspend.nvml import NvmlMemoryProbe, NvmlUnavailable

    try:
        driver = CudaDriver.load(args.libcuda)
        driver.init()
        result["driver_api_version"] = driver.driver_version()
    except CudaCheckpointUnavailable as e:
        result["cuda_checkpoint_unavailable"] = str(e)
        return None, None
    try:
        probe = NvmlMemoryProbe.load(args.libnvml)
    except NvmlUnavailable as e:
        result["nvml_unavailable"] = str(e)
        probe = None
    return driver, probe


def _measure_size(gib: float, args: argparse.Namespace, backends: set[str], driver: Any, probe: Any) -> dict[str, Any]:
    nbytes = int(gib * GiB) // 8 * 8
    entry: dict[str, Any] = {"gib": gib, "bytes": nbytes}
    print(f"gpu_suspend: {gib} GiB ...", file=sys.stderr, flush=True)
    entry["pinned_memcpy"] = bench_memcpy(nbytes, args.repeats)
    ref_d2h, ref_h2d = entry["pinned_memcpy"]["d2h_gbps"], entry["pinned_memcpy"]["h2d_gbps"]
    runs: list[tuple[str, Callable[[], dict[str, Any]]]] = []
    if "cooperative" in backends:
        runs.append(("cooperative", lambda: bench_cooperative(nbytes, args.repeats)))
    if driver is not None:
        runs.append(("cuda_checkpoint", lambda: bench_cuda_checkpoint(nbytes, args.repeats, driver, probe=probe)))
    for key, run in runs:
        try:
            r = run()
            r["suspend_ratio_to_pinned_d2h"] = r["suspend_gbps"] / ref_d2h
            r["resume_ratio_to_pinned_h2d"] = r["resume_gbps"] / ref_h2d
            entry[key] = r
        except Exception as e:
            entry[key] = {"error": repr(e)}
        release_memory()
    return entry


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
    t_start = time.monotonic()
    sizes = [float(s) for s in args.sizes_gib.split(",") if s.strip()]
    backends = {b.strip() for b in args.backends.split(",") if b.strip()}
    props = torch.cuda.get_device_properties(0)
    result: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.gpu_suspend", *(argv if argv is not None else sys.argv[1:])]),
        "device": props.name,
        "device_memory_bytes": props.total_memory,
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "host": platform.node(),
        "started_unix": time.time(),
        "sizes": [],
        "skipped_sizes_gib": [],
    }
    driver, probe = _open_driver(args, result) if "cuda-checkpoint" in backends else (None, None)
    for gib in sizes:
        if args.time_limit_seconds and time.monotonic() - t_start > args.time_limit_seconds:
            result["skipped_sizes_gib"].append(gib)
            continue
        result["sizes"].append(_measure_size(gib, args, backends, driver, probe))
    result["goal"] = goal_verdict(result["sizes"])
    result["seconds"] = time.monotonic() - t_start
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
