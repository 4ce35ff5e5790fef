"""The cooperative spill's phases, in one process, on the CPU (``rose_sdk`` + ``dra_driver``).

    python -m benchmarks.coop_spill [--dir DIR] [--sizes-mib 64,256] [--repeats 3] [--json OUT.json]

For each size a registered float32 tensor of that size (the "device" is the CPU) is offloaded by a
real ``CooperativeOffloader``, then, as in a cooperative spill:

* **sdk_write**: ``spill_to`` into a file ``SpillStore.hand_over`` created (chunks + blake2b,
  fsync) — the workload's part;
* **driver_verify**: ``SpillStore.adopt`` (inode check, fsync, rename, directory fsync, page cache
  dropped, every chunk read back from disk and verified) — the driver's part;
* **drop**: ``drop_host_copy`` and how much the process's resident memory fell (``rss_freed_mib``:
  what the engine's check sees);
* **load_cold**: page cache dropped, then ``load_from`` (read + verify into a new arena) — the
  SDK's part of a resume before its host-to-device copy; ``bit_exact`` compares with the original.

Not measured: the gRPC round trips (two commands, two acknowledgements) and a GPU's copies.
GB/s are 1e9 payload bytes per second, median over ``--repeats``. I/O: files under ``--dir``
(default: a temporary folder in /var/tmp), removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dra_driver.suspend.cooperative import rss_from_status
from dra_driver.suspend.spill import SpillStore
from rose_sdk.offload import CooperativeOffloader

MiB = 1 << 20


def _rss() -> int:
    return rss_from_status(Path("/proc/self/status").read_text()) or 0


def _drop_cache(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def one(d: Path, mib: int, seed: int) -> dict[str, float | bool]:
    store = SpillStore(d, 1 << 40)
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(mib << 18, generator=g)
    want = t.clone()
    off = CooperativeOffloader(tensors={"t": t}, device="cpu")
    n = off.offload().bytes_moved
    h = store.hand_over("bench", os.geteuid(), os.getegid())
    t0 = time.perf_counter()
    off.spill_to(str(h.path))
    t1 = time.perf_counter()
    store.adopt(h, n, n)
    t2 = time.perf_counter()
    rss0 = _rss()
    off.drop_host_copy()
    rss1 = _rss()
    _drop_cache(store.path("bench"))
    t3 = time.perf_counter()
    off.load_from(str(store.path("bench")))
    t4 = time.perf_counter()
    off.restore()
    store.remove("bench")
    return {
        "sdk_write_s": t1 - t0,
        "driver_verify_s": t2 - t1,
        "load_cold_s": t4 - t3,
        "rss_freed_mib": (rss0 - rss1) / MiB,
        "bit_exact": bool(torch.equal(t, want)),
        "bytes": float(n),
    }


def run(d: Path, sizes_mib: list[int], repeats: int) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for mib in sizes_mib:
        runs = [one(d, mib, i) for i in range(repeats)]
        n = runs[0]["bytes"]

        def med(k: str, runs: list[dict[str, float | bool]] = runs) -> float:
            return statistics.median(float(r[k]) for r in runs)

        out.append(
            {
                "size_mib": mib,
                "sdk_write_gbps": n / med("sdk_write_s") / 1e9,
                "driver_verify_gbps": n / med("driver_verify_s") / 1e9,
                "load_cold_gbps": n / med("load_cold_s") / 1e9,
                "rss_freed_mib": med("rss_freed_mib"),
                "bit_exact": all(bool(r["bit_exact"]) for r in runs),
                "runs": runs,
            }
        )
    return {
        "benchmark": "coop_spill",
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "dir": str(d),
        "results": out,
        "all_bit_exact": all(r["bit_exact"] for r in out),
    }


def _sizes(s: str) -> list[int]:
    try:
        xs = [int(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes must be comma-separated MiB integers, got {s!r}") from None
    if not xs or any(x <= 0 for x in xs):
        raise argparse.ArgumentTypeError(f"sizes must be > 0 MiB, got {s!r}")
    return xs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.coop_spill",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dir", type=Path, default=None, help="a folder on the disk to measure (default: /var/tmp)")
    p.add_argument("--sizes-mib", type=_sizes, default=[64, 256], help="comma-separated state sizes in MiB")
    p.add_argument("--repeats", type=int, default=3, help="runs per size (the median is reported)")
    p.add_argument("--json", type=Path, default=None, help="write the result here too")
    a = p.parse_args(argv)
    if a.repeats <= 0:
        p.error(f"--repeats must be > 0, got {a.repeats}")
    d = Path(tempfile.mkdtemp(prefix="rose-coop-spill-", dir=a.dir or "/var/tmp"))
    try:
        rep = run(d / "spill", a.sizes_mib, a.repeats)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    text = json.dumps(rep, indent=1)
    if a.json is not None:
        a.json.write_text(text)
    for r in rep["results"]:
        print(
            f"{r['size_mib']:>6} MiB  sdk write {r['sdk_write_gbps']:.3f} GB/s  driver verify"
            f" {r['driver_verify_gbps']:.3f} GB/s  cold load {r['load_cold_gbps']:.3f} GB/s"
            f"  RSS freed {r['rss_freed_mib']:.0f} MiB  bit-exact {r['bit_exact']}"
        )
    return 0 if rep["all_bit_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
