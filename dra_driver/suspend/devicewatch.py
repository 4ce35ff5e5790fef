"""What a lent occupant holds on its GPU, as the driver observes it — never as the workload says.

"Serving wins" is decided from observations only (ARCHITECTURE §9): an acknowledgement, a
registration's ``current_state`` or a request field is a hint, never proof that the device is
free. An :class:`Observation` is what is resident for one lent claim now: bytes nobody can be
charged with by PID (the simulated device-memory file, the driver's own ledger of simulated
occupants) and the host PIDs holding the device (with the bytes each holds when the source
knows it). The decisions on it are pure (:func:`resident_bytes`, :func:`device_free`).

Two watches, one per kind of node:

* :class:`SimulatedDeviceMemory` (CPU nodes, ``--gpu-backend simulated``): each prepared lent
  claim gets ``<claims-root>/<claimUID>/device-memory`` (mode 0666), mounted in its containers at
  ``/run/rose/claims/<claimUID>/device-memory`` (env ``ROSE_SIMULATED_DEVICE_MEMORY``). A workload
  holds simulated device memory by keeping the file open and allocating bytes in it; it frees by
  truncating it to 0. Resident bytes = ``st_blocks * 512``; holders = PIDs with an fd or a mapping
  of the file's inode (``/proc/*/fd``, ``/proc/*/maps``, as nvidia-smi lists a GPU's processes).
  Once the driver killed the holders it truncates the file itself (as the GPU driver frees a dead
  process's memory). Plus a ledger callable: bytes of occupants that have no process at all (the
  engine's simulated occupants on KWOK), which only the driver itself moves.
* :class:`NvmlDeviceWatch` (GPU nodes): NVML's compute processes on the claim's GPUs whose
  cgroup names one of the claim's pods; the device is free when none holds more than the context
  allowance (a CUDA context stays after the state is offloaded).

I/O boundary: the device-memory files and ``/proc`` (:class:`SimulatedDeviceMemory`), the
injected NVML process lister and cgroup reader (:class:`NvmlDeviceWatch`); nothing else.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

log = logging.getLogger("rose.suspend.devicewatch")

DEVICE_MEMORY_NAME = "device-memory"
ENV_SIMULATED_DEVICE_MEMORY = "ROSE_SIMULATED_DEVICE_MEMORY"
CONTAINER_CLAIMS_ROOT = "/run/rose/claims"  # where a lent claim's CDI spec mounts its directory
DEFAULT_CONTEXT_ALLOWANCE_BYTES = 512 << 20  # a CUDA context with cuBLAS/cuDNN handles, no tensors


@dataclass(frozen=True)
class Holder:
    """A host process holding the device; ``bytes`` is what it holds and can be charged with
    (0: its bytes are counted elsewhere, e.g. in the simulated file; -1: the source cannot tell)."""

    pid: int
    bytes: int = -1


@dataclass(frozen=True)
class Target:
    """One lent claim whose device must be freed: the driver's own record of it."""

    claim_uid: str
    gpu_indexes: tuple[int, ...]
    pod_uids: tuple[str, ...]


@dataclass(frozen=True)
class Observation:
    """What the driver saw resident for one lent claim."""

    unattributed_bytes: int = 0  # bytes not charged to a PID (simulated file, ledger)
    holders: tuple[Holder, ...] = ()
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    def pids(self) -> tuple[int, ...]:
        return tuple(sorted({h.pid for h in self.holders}))

    def describe(self, allowance_bytes: int = 0) -> str:
        held = ", ".join(f"{h.pid}" + (f" ({h.bytes} B)" if h.bytes >= 0 else "") for h in self.holders) or "none"
        return f"{resident_bytes(self, allowance_bytes)} B resident ({self.source}); holder PIDs: {held}"


def resident_bytes(obs: Observation, allowance_bytes: int = 0) -> int:
    """Pure: occupant bytes on the device that serving would find — unattributed bytes plus every
    holder's bytes above the context allowance (a holder of unknown size counts as its allowance+1:
    an unknown is not free)."""
    over = 0
    for h in obs.holders:
        if h.bytes < 0:
            over += allowance_bytes + 1
        elif h.bytes > allowance_bytes:
            over += h.bytes
    return max(0, obs.unattributed_bytes) + over


def device_free(obs: Observation, allowance_bytes: int = 0) -> bool:
    """Pure: may serving be prepared on this device? Holders may keep an empty context open."""
    return resident_bytes(obs, allowance_bytes) == 0


class DeviceWatch(Protocol):
    """The driver's eyes on a lent claim's device."""

    allowance_bytes: int

    def observe(self, target: Target) -> Observation: ...

    def free_dead(self, target: Target) -> None:
        """Free what the (killed) holders left, as the GPU driver frees a dead process's memory."""
        ...

    def provision(self, claim_uid: str) -> dict[str, str]:
        """Create what a newly prepared lent claim's containers use; the env the CDI spec adds."""
        ...

    def forget(self, claim_uid: str) -> None: ...


# ---------------------------------------------------------------------- simulated (CPU nodes)


def parse_maps_inodes(maps: str) -> set[tuple[str, int]]:
    """Pure: ``(device "MM:mm", inode)`` of every file mapping in a ``/proc/<pid>/maps`` text."""
    out: set[tuple[str, int]] = set()
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            continue
        with contextlib.suppress(ValueError):
            inode = int(parts[4])
            if inode:
                out.add((parts[3], inode))
    return out


def maps_device(st_dev: int) -> str:
    """Pure: ``st_dev`` in the ``major:minor`` hex form of ``/proc/<pid>/maps``."""
    return f"{os.major(st_dev):02x}:{os.minor(st_dev):02x}"


def _holds_by_fd(pid_dir: Path, dev: int, ino: int) -> bool:
    try:
        fds = list((pid_dir / "fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            st = os.stat(fd)
        except OSError:
            continue
        if st.st_ino == ino and st.st_dev == dev:
            return True
    return False


def _holds_by_map(pid_dir: Path, dev: int, ino: int) -> bool:
    try:
        maps = (pid_dir / "maps").read_text()
    except OSError:
        return False
    want = maps_device(dev)
    return any(i == ino and (d == want or d.lower() == want) for d, i in parse_maps_inodes(maps))


def holders_of(path: Path, proc: Path = Path("/proc")) -> tuple[int, ...]:
    """PIDs with an open fd or a mapping of ``path``'s inode (unreadable processes are skipped)."""
    try:
        st = path.stat()
    except OSError:
        return ()
    pids = []
    with contextlib.suppress(OSError):
        for d in proc.iterdir():
            if d.name.isdigit() and (_holds_by_fd(d, st.st_dev, st.st_ino) or _holds_by_map(d, st.st_dev, st.st_ino)):
                pids.append(int(d.name))
    return tuple(sorted(pids))


class SimulatedDeviceMemory:
    """The explicit ``simulated`` device accounting: one device-memory file per lent claim."""

    allowance_bytes = 0

    def __init__(
        self,
        claims_root: Path,
        *,
        ledger: Callable[[str], int] | None = None,
        ledger_free: Callable[[str], None] | None = None,
        proc: Path = Path("/proc"),
    ) -> None:
        self.root = claims_root
        self._ledger = ledger
        self._ledger_free = ledger_free
        self._proc = proc

    def path(self, claim_uid: str) -> Path:
        if not claim_uid or "/" in claim_uid or claim_uid in (".", ".."):
            raise ValueError(f"claim UID {claim_uid!r} cannot name a directory")
        return self.root / claim_uid / DEVICE_MEMORY_NAME

    def provision(self, claim_uid: str) -> dict[str, str]:
        """Create the claim's empty device-memory file (0666) in its socket directory, when that
        directory exists (the node agent serves the claim); the env naming it in the container."""
        p = self.path(claim_uid)
        if not p.parent.is_dir():
            return {}
        fd = os.open(p, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o666)
        try:
            os.fchmod(fd, 0o666)
        finally:
            os.close(fd)
        return {ENV_SIMULATED_DEVICE_MEMORY: f"{CONTAINER_CLAIMS_ROOT}/{claim_uid}/{DEVICE_MEMORY_NAME}"}

    def observe(self, target: Target) -> Observation:
        p = self.path(target.claim_uid)
        notes: list[str] = []
        try:
            file_bytes = os.stat(p, follow_symlinks=False).st_blocks * 512
        except FileNotFoundError:
            file_bytes = 0
        ledger = self._ledger(target.claim_uid) if self._ledger is not None else 0
        if ledger:
            notes.append(f"{ledger} B of simulated occupant (driver ledger)")
        holders = tuple(Holder(pid, 0) for pid in holders_of(p, self._proc))
        return Observation(file_bytes + ledger, holders, "simulated device memory", tuple(notes))

    def free_dead(self, target: Target) -> None:
        p = self.path(target.claim_uid)
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(p, os.O_WRONLY | os.O_NOFOLLOW)
            try:
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)
        if self._ledger_free is not None:
            self._ledger_free(target.claim_uid)

    def forget(self, claim_uid: str) -> None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            self.path(claim_uid).unlink()


# ---------------------------------------------------------------------- NVML (GPU nodes)


class GpuProcessLister(Protocol):
    """NVML's compute processes of one GPU: ``(host pid, used bytes or None)``."""

    def gpu_processes(self, index: int) -> list[tuple[int, int | None]]: ...


def read_cgroup(pid: int, proc: Path = Path("/proc")) -> str:
    try:
        return (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return ""


def belongs_to(cgroup: str, pod_uids: Iterable[str]) -> bool:
    """Pure: does a process's cgroup text name one of the pods (kubelet writes ``_`` for ``-``)?"""
    return any(u and (u in cgroup or u.replace("-", "_") in cgroup) for u in pod_uids)


class NvmlDeviceWatch:
    """Processes of the claim's pods on its GPUs, as NVML lists them (host PIDs, hostPID)."""

    def __init__(
        self,
        lister: GpuProcessLister,
        allowance_bytes: int = DEFAULT_CONTEXT_ALLOWANCE_BYTES,
        cgroup_of: Callable[[int], str] = read_cgroup,
    ) -> None:
        if allowance_bytes < 0:
            raise ValueError(f"context allowance must be >= 0 bytes, got {allowance_bytes}")
        self.allowance_bytes = allowance_bytes
        self._lister = lister
        self._cgroup_of = cgroup_of

    def observe(self, target: Target) -> Observation:
        holders: dict[int, int] = {}
        for idx in target.gpu_indexes:
            for pid, used in self._lister.gpu_processes(idx):
                if not belongs_to(self._cgroup_of(pid), target.pod_uids):
                    continue
                b = -1 if used is None else used
                holders[pid] = -1 if b < 0 or holders.get(pid, 0) < 0 else holders.get(pid, 0) + b
        return Observation(0, tuple(Holder(p, b) for p, b in sorted(holders.items())), "nvml")

    def free_dead(self, target: Target) -> None:
        del target  # the GPU driver frees a dead process's memory itself

    def provision(self, claim_uid: str) -> dict[str, str]:
        del claim_uid
        return {}

    def forget(self, claim_uid: str) -> None:
        del claim_uid


def target_of(claim_uid: str, gpu_indexes: Sequence[int], pod_uids: Sequence[str]) -> Target:
    return Target(claim_uid, tuple(sorted(set(gpu_indexes))), tuple(pod_uids))
