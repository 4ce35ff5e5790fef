"""The node's crash-safe state: a two-phase checkpoint file under a file lock.

One JSON document (``<state-dir>/checkpoint.json``) records every claim this node prepared and
every lent workload it suspended:

* claims: ``PrepareStarted`` → ``PrepareCompleted`` → ``UnprepareStarted`` → (removed);
* suspensions (keyed by the lendable claim UID): ``SuspendStarted`` → ``Suspended`` (or
  ``CheckpointedEvicted`` / ``EnforcedEvicted`` / ``SuspendFailed``) → ``ResumeStarted`` → (removed), with the set of
  holders (serving claim UIDs or ``request/<podUID>``) that keep the occupant suspended;
* fences: the last time-slice fencing token seen per group (``dra_driver.fencing``).

Every write is atomic (temp, fsync, rename, directory fsync) and carries a SHA-256 checksum of
the canonical JSON; a load verifies it. The node's boot ID is stored: after a reboot the
processes and ``/var/run/cdi`` are gone, so the old state no longer describes anything.

``ROSE_DRIVER_CRASH_AT`` (test hook) makes the process ``os._exit(137)`` at a named checkpoint:
``name`` (first hit) or ``name:N`` (N-th hit). Names: see :data:`CRASH_POINTS`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.claims import PodRef, PreparedDevice
from rose_common.atomic import atomic_write

STATE_VERSION = 1

PREPARE_STARTED = "PrepareStarted"
PREPARE_COMPLETED = "PrepareCompleted"
UNPREPARE_STARTED = "UnprepareStarted"

SUSPEND_STARTED = "SuspendStarted"
SUSPENDED = "Suspended"
CHECKPOINTED_EVICTED = "CheckpointedEvicted"
SUSPEND_FAILED = "SuspendFailed"
ENFORCED_EVICTED = "EnforcedEvicted"  # the driver killed the occupant at the deadline and evicted its pod
RESUME_STARTED = "ResumeStarted"

CRASH_POINTS = (
    "prepare-started",
    "suspend-started",
    "suspend-engine-returned",
    "suspend-completed",
    "prepare-cdi-written",
    "prepare-completed",
    "unprepare-started",
    "unprepare-cdi-removed",
    "resume-started",
    "resume-engine-returned",
    "unprepare-completed",
    "state-temp-written",
    "state-renamed",
)

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


class StateCorruptError(RuntimeError):
    """The checkpoint file fails its checksum or shape check."""


@dataclass
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: str
    devices: list[PreparedDevice]
    pods: list[PodRef] = field(default_factory=list)
    grace_seconds: float = 30.0

    def roles(self) -> set[str]:
        return {d.role for d in self.devices}

    def to_json(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state,
            "devices": [d.to_json() for d in self.devices],
            "pods": [{"namespace": p.namespace, "name": p.name, "uid": p.uid} for p in self.pods],
            "graceSeconds": self.grace_seconds,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> ClaimRecord:
        return ClaimRecord(
            uid=str(d["uid"]),
            namespace=str(d["namespace"]),
            name=str(d["name"]),
            state=str(d["state"]),
            devices=[PreparedDevice.from_json(x) for x in d["devices"]],
            pods=[PodRef(str(p["namespace"]), str(p["name"]), str(p["uid"])) for p in d.get("pods", [])],
            grace_seconds=float(d.get("graceSeconds", 30.0)),
        )


@dataclass
class Suspension:
    claim_uid: str  # the lendable claim whose occupant is suspended
    state: str
    held_by: list[str]
    backend: str = ""
    bytes_moved: int = 0
    message: str = ""
    pids: list[int] = field(default_factory=list)  # host PIDs the driver checkpointed itself (enforced)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "claimUID": self.claim_uid,
            "state": self.state,
            "heldBy": sorted(self.held_by),
            "backend": self.backend,
            "bytesMoved": self.bytes_moved,
            "message": self.message,
        }
        if self.pids:
            out["pids"] = sorted(self.pids)
        return out

    @staticmethod
    def from_json(d: dict[str, Any]) -> Suspension:
        return Suspension(
            claim_uid=str(d["claimUID"]),
            state=str(d["state"]),
            held_by=[str(x) for x in d["heldBy"]],
            backend=str(d.get("backend", "")),
            bytes_moved=int(d.get("bytesMoved", 0)),
            message=str(d.get("message", "")),
            pids=[int(x) for x in d.get("pids", [])],
        )


@dataclass
class NodeStateData:
    boot_id: str
    claims: dict[str, ClaimRecord] = field(default_factory=dict)
    suspensions: dict[str, Suspension] = field(default_factory=dict)
    fences: dict[str, int] = field(default_factory=dict)

    def copy(self) -> NodeStateData:
        return copy.deepcopy(self)

    def body(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "bootID": self.boot_id,
            "claims": {k: v.to_json() for k, v in sorted(self.claims.items())},
            "suspensions": {k: v.to_json() for k, v in sorted(self.suspensions.items())},
            "fences": dict(sorted(self.fences.items())),
        }


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def encode(data: NodeStateData) -> bytes:
    body = data.body()
    doc = dict(body, checksum="sha256:" + hashlib.sha256(_canonical(body)).hexdigest())
    return (json.dumps(doc, sort_keys=True, indent=1) + "\n").encode()


def decode(raw: bytes) -> NodeStateData:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise StateCorruptError(f"checkpoint is not JSON: {e}") from e
    if not isinstance(doc, dict) or "checksum" not in doc:
        raise StateCorruptError("checkpoint has no checksum field")
    checksum = doc.pop("checksum")
    want = "sha256:" + hashlib.sha256(_canonical(doc)).hexdigest()
    if checksum != want:
        raise StateCorruptError(f"checkpoint checksum mismatch: file says {checksum}, content hashes to {want}")
    if doc.get("version") != STATE_VERSION:
        raise StateCorruptError(f"checkpoint version {doc.get('version')!r}, this driver reads {STATE_VERSION}")
    try:
        return NodeStateData(
            boot_id=str(doc["bootID"]),
            claims={k: ClaimRecord.from_json(v) for k, v in doc["claims"].items()},
            suspensions={k: Suspension.from_json(v) for k, v in doc["suspensions"].items()},
            fences={str(k): int(v) for k, v in doc.get("fences", {}).items()},
        )
    except (KeyError, TypeError, ValueError) as e:
        raise StateCorruptError(f"checkpoint has a malformed record: {e!r}") from e


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
