"""The node's crash-safe state: a two-phase checkpoint file under a file lock.

One JSON document (``<state-dir>/checkpoint.json``) records every claim this node prepared and
every lent workload it suspended:

* claims: ``PrepareStarted`` → ``PrepareCompleted`` → ``UnprepareStarted`` → (removed);
* suspensions (keyed by the lendable claim UID): ``SuspendStarted`` → ``Suspended`` (or
  ``CheckpointedEvicted`` / ``EnforcedEvicted`` / ``SuspendFailed``) → ``ResumeStarted`` → (removed), with the set of
  holders (serving claim UIDs or ``request/<podUID>``) that keep the occupant suspended;
* fences: the last time-slice fencing token seen per group (``dra_driver.fencing``).

The document carries a SHA-256 checksum of its canonical JSON; :func:`decode` verifies it. The
node's boot ID is stored: after a reboot the processes and ``/var/run/cdi`` are gone, so the old
state no longer describes anything.

I/O boundary: none. This module holds the records and their encoding (pure);
:mod:`dra_driver.checkpoint` reads and atomically writes the file, reads the boot ID, and holds
the ``ROSE_DRIVER_CRASH_AT`` test hook whose point names are :data:`CRASH_POINTS`.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from dra_driver.claims import PodRef, PreparedDevice

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
