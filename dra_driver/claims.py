"""Pure checks of a ResourceClaim read from the API: which of this node's devices it holds.

No I/O here: the caller GETs the claim and passes the plain JSON dict. Every refusal is a
:class:`ClaimError` whose message says what is wrong and what to fix; the gRPC layer turns it
into that claim's ``error`` field, never into a failed RPC.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rose_common import names
from rose_common.kube import objects
from rose_common.quantity import to_int
from rose_common.slices import parse_device_name

CDI_VENDOR = names.DRIVER_NAME
CDI_CLASS = "gpu"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"


class ClaimError(Exception):
    """This claim cannot be prepared here; the message is returned to the kubelet."""


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str

    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    gpu_index: int
    gpu_uuid: str
    role: str
    # A share (role "share" or "servingshare"): what the scheduler's allocation consumed of the device
    # (``consumedCapacity``): memory bytes and compute percent; 0 for whole-GPU devices
    memory_bytes: int = 0
    compute_percent: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requestNames": list(self.request_names),
            "pool": self.pool,
            "device": self.device,
            "cdiIDs": list(self.cdi_ids),
            "gpuIndex": self.gpu_index,
            "gpuUUID": self.gpu_uuid,
            "role": self.role,
        }
        if self.role in names.SHARE_ROLES:
            out["memoryBytes"] = self.memory_bytes
            out["computePercent"] = self.compute_percent
        return out

    @staticmethod
    def from_json(d: dict[str, Any]) -> PreparedDevice:
        return PreparedDevice(
            request_names=tuple(d["requestNames"]),
            pool=str(d["pool"]),
            device=str(d["device"]),
            cdi_ids=tuple(d["cdiIDs"]),
            gpu_index=int(d["gpuIndex"]),
            gpu_uuid=str(d["gpuUUID"]),
            role=str(d["role"]),
            memory_bytes=int(d.get("memoryBytes", 0)),
            compute_percent=int(d.get("computePercent", 0)),
        )


@dataclass(frozen=True)
class ValidClaim:
    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]
    pods: tuple[PodRef, ...] = field(default_factory=tuple)


def cdi_device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def cdi_device_id(claim_uid: str, device: str) -> str:
    return f"{CDI_KIND}={cdi_device_name(claim_uid, device)}"


def base_request_name(request: str) -> str:
    """``main/sub`` → ``main`` (the kubelet matches container claims on the base name)."""
    return request.split("/", 1)[0]


def share_consumed(ref: ClaimRef, device: str, result: dict[str, Any]) -> tuple[int, int]:
    """A share's allocation result → (memory bytes, compute percent) it consumed. The scheduler
    always writes ``consumedCapacity`` for a device with ``allowMultipleAllocations``; a result
    without it (or with a bad quantity) is refused: the driver could not enforce the share."""
    consumed = result.get("consumedCapacity") or {}
    try:
        memory = to_int(str(consumed[names.CAPACITY_MEMORY]))
        compute = to_int(str(consumed[names.CAPACITY_COMPUTE]))
    except (KeyError, ValueError) as e:
        raise ClaimError(
            f"ResourceClaim {ref.key()}: share device {device} has no valid consumedCapacity "
            f"(memory and compute; got {consumed}): {e}"
        ) from e
    if memory <= 0 or not 0 < compute <= 100:
        raise ClaimError(
            f"ResourceClaim {ref.key()}: share device {device} consumed memory {memory} and compute "
            f"{compute}: memory must be > 0 and compute within 1..100 percent"
        )
    return memory, compute


def shares_consumed(ref: ClaimRef, device: str, results: list[dict[str, Any]]) -> tuple[int, int]:
    """What a claim's shares of one device consumed in all: a claim may hold several (one per
    request), each with its own ``shareID``."""
    consumed = [share_consumed(ref, device, r) for r in results if r.get("device") == device]
    return sum(m for m, _ in consumed), sum(c for _, c in consumed)


def validate_claim(
    claim: dict[str, Any], ref: ClaimRef, driver: str, pool: str, gpu_uuids: dict[int, str]
) -> ValidClaim:
    """Check a claim GET from the API against the kubelet's request and this node's GPUs.

    ``gpu_uuids`` maps the GPU index to the physical GPU uuid of every GPU this driver serves.
    """
    uid = objects.uid(claim)
    if uid != ref.uid:
        raise ClaimError(
            f"ResourceClaim {ref.key()} has UID {uid}, the kubelet asked for {ref.uid}: the claim got "
            "replaced; the kubelet will retry with the new claim"
        )
    if objects.deleting(claim) and not objects.status(claim).get("reservedFor"):
        raise ClaimError(f"ResourceClaim {ref.key()} is being deleted and reserved for no pod")
    status = claim.get("status") or {}
    allocation = status.get("allocation")
    if not allocation:
        raise ClaimError(
            f"ResourceClaim {ref.key()} is not allocated (status.allocation is empty): the scheduler "
            "must allocate it before the kubelet prepares it"
        )
    results = (allocation.get("devices") or {}).get("results") or []
    ours = [r for r in results if r.get("driver") == driver]
    if not ours:
        others = sorted({str(r.get("driver")) for r in results})
        raise ClaimError(
            f"ResourceClaim {ref.key()} has no devices of driver {driver} (allocated drivers: "
            f"{', '.join(others) or 'none'}): it was sent to the wrong driver"
        )
    devices: list[PreparedDevice] = []
    seen: set[str] = set()
    for r in ours:
        dev = str(r.get("device", ""))
        rpool = str(r.get("pool", ""))
        request = str(r.get("request", ""))
        if rpool != pool:
            raise ClaimError(
                f"ResourceClaim {ref.key()}: device {dev} is allocated from pool {rpool!r}, this driver "
                f"serves pool {pool!r} (node {pool}): the claim belongs to another node"
            )
        try:
            index, role = parse_device_name(dev)
        except ValueError as e:
            raise ClaimError(f"ResourceClaim {ref.key()}: {e}") from e
        if index not in gpu_uuids:
            raise ClaimError(
                f"ResourceClaim {ref.key()}: device {dev} names GPU {index}, but this node has GPUs "
                f"{sorted(gpu_uuids)}: the ResourceSlice was stale when the claim was allocated"
            )
        if dev in seen:
            continue
        seen.add(dev)
        reqs = tuple(sorted({base_request_name(x.get("request", "")) for x in ours if x.get("device") == dev}))
        memory, compute = shares_consumed(ref, dev, ours) if role in names.SHARE_ROLES else (0, 0)
        devices.append(
            PreparedDevice(
                request_names=reqs or (base_request_name(request),),
                pool=pool,
                device=dev,
                cdi_ids=(cdi_device_id(ref.uid, dev),),
                gpu_index=index,
                gpu_uuid=gpu_uuids[index],
                role=role,
                memory_bytes=memory,
                compute_percent=compute,
            )
        )
    return ValidClaim(ref=ref, devices=tuple(devices), pods=reserved_pods(claim, ref.namespace))


def reserved_pods(claim: dict[str, Any], namespace: str) -> tuple[PodRef, ...]:
    """The pods in the claim's ``status.reservedFor`` (of ``namespace``, the claim's), in order. Pure."""
    return tuple(
        PodRef(namespace=namespace, name=str(p.get("name", "")), uid=str(p.get("uid", "")))
        for p in objects.status(claim).get("reservedFor") or []
        if p.get("resource") == "pods"
    )
