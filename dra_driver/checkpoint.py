"""The node's checkpoint file and boot ID, and the crash test hook: the I/O half of :mod:`dra_driver.state`.

:class:`CheckpointFile` reads the checkpoint and writes it atomically (temp, fsync, rename,
directory fsync) under the node lock the caller holds; :func:`read_boot_id` reads the kernel's
boot ID. ``ROSE_DRIVER_CRASH_AT`` (test hook) makes the process ``os._exit(137)`` at a named
checkpoint: ``name`` (first hit) or ``name:N`` (N-th hit). Names: see
:data:`dra_driver.state.CRASH_POINTS`.
"""

from __future__ import annotations

import os
from pathlib import Path

from dra_driver.state import NodeStateData, decode, encode
from rose_common.atomic import atomic_write

CRASH_ENV = "ROSE_DRIVER_CRASH_AT"
_crash_hits: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Test hook: exit abruptly (like kill -9) when ``ROSE_DRIVER_CRASH_AT`` names this point.

    While the variable is set, every point's hits are counted (``crash_hits``), so a test can
    learn from a clean run which ``name:N`` exist.
    """
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    _crash_hits[name] = _crash_hits.get(name, 0) + 1
    target, _, nth = spec.partition(":")
    if target == name and _crash_hits[name] == (int(nth) if nth else 1):
        os._exit(137)


def crash_hits() -> dict[str, int]:
    return dict(_crash_hits)


def reset_crash_hits() -> None:
    _crash_hits.clear()


def read_boot_id(path: Path = Path("/proc/sys/kernel/random/boot_id")) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "unknown"


class CheckpointFile:
    """Reads and atomically writes the checkpoint; the caller holds the node lock."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self, boot_id: str) -> tuple[NodeStateData, bool]:
        """The stored state, and whether it came from a previous boot (then it is discarded)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return NodeStateData(boot_id=boot_id), False
        data = decode(raw)
        if data.boot_id != boot_id:
            return NodeStateData(boot_id=boot_id), True
        return data, False

    def save(self, data: NodeStateData) -> None:
        atomic_write(self.path, encode(data), mode=0o600, hook=lambda p: crash_point(f"state-{p}"))
