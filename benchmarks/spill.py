"""Spill and restore bandwidth of the disk tier of suspended state (``dra_driver.suspend.spill``).

    python -m benchmarks.spill [--dir DIR] [--sizes-mib 64,256,512] [--repeats 3]
                               [--chunk-mib 8] [--json OUT.json]

For each size, random bytes in DRAM (the suspended state's host copy, a Python ``bytearray``)
go through the real ``SpillStore``:

* **spill**: ``SpillStore.spill`` — chunked buffered writes with a blake2b-256 digest per chunk,
  fsync, rename, directory fsync, read back and verified, then the DRAM copy dropped: the whole
  time the DRAM copy cannot yet be given up;
* **restore (cold)**: the spill file's pages are dropped from the page cache first
  (``posix_fadvise(DONTNEED)`` after the fsync), then ``SpillStore.restore``: read, verify every
  chunk, into DRAM; the result is compared with the original (``bit_exact``);
* **baselines** on the same directory: a plain ``write`` + ``fsync`` of the same bytes and a plain
  cold ``read`` (what the disk and the page cache give without digests and verification), and
  blake2b-256 alone over the bytes in memory (the CPU cost a spill pays twice: write and verify).

GB/s are 1e9 bytes per second of the payload, median over ``--repeats``. CPU path only: with a
GPU the DRAM copy would come from pinned staging buffers (not measured here). I/O: files under
``--dir`` (default: a temporary folder in /var/tmp), removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from dra_driver.suspend.spill import SpillStore

MiB = 1 << 20


class DramCopy:
    """The DRAM copy of one state, as a bytearray (spill.HostCopy)."""

    def __init__(self, data: bytearray) -> None:
        self.data: bytearray | None = data

    def host_bytes(self, key: str) -> int | None:
        return None if self.data is None else len(self.data)

    def read_host(self, key: str, chunk_bytes: int) -> Iterator[bytes | memoryview]:
        assert self.data is not None
        view = memoryview(self.data)
        for off in range(0, len(view), chunk_bytes):
            yield view[off : off + chunk_bytes]

    def drop_host(self, key: str) -> None:
        self.data = None

    def refill_host(self, key: str, chunks: Iterable[bytes]) -> int:
        out = bytearray()
        for c in chunks:
            out += c
        self.data = out
        return len(out)


def _drop_cache(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _baseline(d: Path, data: bytearray, chunk: int) -> tuple[float, float]:
    p = d / "baseline.bin"
    view = memoryview(data)
    t0 = time.perf_counter()
    with open(p, "wb", buffering=0) as f:
        for off in range(0, len(view), chunk):
            f.write(view[off : off + chunk])
        os.fsync(f.fileno())
    w = time.perf_counter() - t0
    _drop_cache(p)
    t0 = time.perf_counter()
    with open(p, "rb", buffering=0) as f:
        while f.read(chunk):
            pass
    r = time.perf_counter() - t0
    p.unlink()
    return w, r


def _hash_seconds(data: bytearray, chunk: int) -> float:
    """blake2b-256 over the bytes once, chunk by chunk (the CPU cost the spill pays twice)."""
    view = memoryview(data)
    t0 = time.perf_counter()
    for off in range(0, len(view), chunk):
        hashlib.blake2b(view[off : off + chunk], digest_size=32).digest()
    return time.perf_counter() - t0


def run(d: Path, sizes_mib: list[int], repeats: int, chunk_mib: int) -> dict[str, Any]:
    chunk = chunk_mib * MiB
    rows = []
    for size in sizes_mib:
        n = size * MiB
        original = bytearray(os.urandom(n))
        spill_s, restore_s, base_w, base_r, hashes, exact = [], [], [], [], [], True
        for i in range(repeats):
            store = SpillStore(d / f"tier-{size}-{i}", 2 * n, chunk_bytes=chunk)
            host = DramCopy(bytearray(original))
            t0 = time.perf_counter()
            store.spill("state", host, n)
            spill_s.append(time.perf_counter() - t0)
            assert host.data is None
            _drop_cache(store.path("state"))
            t0 = time.perf_counter()
            store.restore("state", host)
            restore_s.append(time.perf_counter() - t0)
            exact = exact and host.data == original
            host.data = None
            shutil.rmtree(store.root)
            w, r = _baseline(d, original, chunk)
            base_w.append(w)
            base_r.append(r)
            hashes.append(_hash_seconds(original, chunk))

        def gbps(xs: list[float], n: int = n) -> float:
            return round(n / statistics.median(xs) / 1e9, 3)

        rows.append(
            {
                "size_mib": size,
                "spill_gbps": gbps(spill_s),
                "restore_cold_gbps": gbps(restore_s),
                "baseline_write_fsync_gbps": gbps(base_w),
                "baseline_read_cold_gbps": gbps(base_r),
                "blake2b_only_gbps": gbps(hashes),
                "spill_seconds": [round(x, 4) for x in spill_s],
                "restore_seconds": [round(x, 4) for x in restore_s],
                "bit_exact": exact,
            }
        )
    return {
        "benchmark": "spill",
        "dir": str(d),
        "chunk_mib": chunk_mib,
        "repeats": repeats,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "results": rows,
        "all_bit_exact": all(r["bit_exact"] for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.spill", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--dir", type=Path, default=None, help="a folder on the disk to measure (default: /var/tmp)")
    p.add_argument("--sizes-mib", default="64,256,512", help="comma-separated state sizes in MiB")
    p.add_argument("--repeats", type=int, default=3, help="runs per size (the median is reported)")
    p.add_argument("--chunk-mib", type=int, default=8, help="spill chunk size in MiB")
    p.add_argument("--json", type=Path, default=None, help="write the result here too")
    args = p.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes_mib.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes-mib must be comma-separated integers, got {args.sizes_mib!r}")
    if not sizes or any(not 1 <= s <= 16384 for s in sizes):
        p.error(f"--sizes-mib must be between 1 and 16384 each, got {args.sizes_mib!r}")
    if not 1 <= args.repeats <= 50:
        p.error(f"--repeats must be in [1, 50], got {args.repeats}")
    if not 1 <= args.chunk_mib <= 1024:
        p.error(f"--chunk-mib must be in [1, 1024], got {args.chunk_mib}")
    base = args.dir if args.dir is not None else Path("/var/tmp")
    d = Path(tempfile.mkdtemp(prefix="rose-spill-bench-", dir=base))
    try:
        res = run(d, sizes, args.repeats, args.chunk_mib)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if res["all_bit_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
