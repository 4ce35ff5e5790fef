"""The shape of ROSE's GPU ResourceSlices: every physical GPU published twice.

ARCHITECTURE §3: each physical GPU appears once as a *serving* device and once as a
*lendable* device. Both devices carry the same ``physicalGPU`` attribute, so the driver can
enforce "serving wins" at prepare time. This module is pure data shaping, shared by the DRA
driver's publisher and the local cluster's seed slices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rose_common import names


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as discovered on a node (NVML or the simulated backend)."""

    index: int
    uuid: str
    model: str
    memory_bytes: int


def device_name(index: int, role: str) -> str:
    """DNS-label device name within the node's pool, e.g. ``gpu-3-lendable``."""
    if role not in names.ROLES:
        raise ValueError(f"role must be one of {', '.join(names.ROLES)}, got {role!r}")
    return f"gpu-{index}-{role}"


def parse_device_name(name: str) -> tuple[int, str]:
    """Inverse of :func:`device_name`: ``gpu-3-lendable`` → ``(3, "lendable")``."""
    parts = name.split("-")
    if len(parts) != 3 or parts[0] != "gpu" or not parts[1].isdigit():
        raise ValueError(f"not a ROSE GPU device name: {name!r} (expected gpu-<index>-<role>)")
    role = parts[2]
    if role not in names.ROLES:
        raise ValueError(f"not a ROSE GPU device name: {name!r} (unknown role {role!r})")
    return int(parts[1]), role


# A share's request policy (docs/dra-lending.md, "GPU shares"): memory in steps of 1 GiB (default
# 1 GiB), compute in steps of 5 percent (default 5). allowMultipleAllocations makes every capacity
# of the device consumable: the scheduler sums consumedCapacity over the claims allocated on it.
SHARE_MEMORY_STEP = 1024**3
SHARE_COMPUTE_STEP = 5
SHARE_COMPUTE_TOTAL = 100


def share_step_up(memory_bytes: int, compute_percent: int) -> tuple[int, int]:
    """A share's request rounded up to the request policy, as the scheduler rounds it: memory to a
    whole number of 1 GiB steps, compute to 5 % steps (at least one step each, compute at most 100)."""
    memory = max(1, -(-memory_bytes // SHARE_MEMORY_STEP)) * SHARE_MEMORY_STEP
    compute = max(1, -(-compute_percent // SHARE_COMPUTE_STEP)) * SHARE_COMPUTE_STEP
    return memory, min(SHARE_COMPUTE_TOTAL, compute)


def share_fraction(memory_bytes: int, compute_percent: int, gpu_memory: int) -> float:
    """The fraction of one GPU a share takes: the larger of its memory fraction (of ``gpu_memory``
    bytes; 0 when that is unknown) and its compute fraction. The one definition the extender, the
    controller and the planner's callers share (issue 27 §3)."""
    memory = memory_bytes / gpu_memory if gpu_memory > 0 else 0.0
    return max(memory, compute_percent / SHARE_COMPUTE_TOTAL)


def share_device(gpu: GpuInfo, role: str = names.ROLE_SHARE, binding_conditions: bool = False) -> dict[str, Any]:
    """The shareable device ``gpu-N-share`` of one GPU: ``allowMultipleAllocations`` with the
    consumable capacities ``memory`` (bytes, the GPU's memory) and ``compute`` (percent, 100). With
    ``role`` ``servingshare``: serving's own shareable device ``gpu-N-servingshare``, the same
    capacities, summed by the scheduler over serving's claims only (the driver fits the GPU's RL
    shares around them by reclaiming). With ``binding_conditions`` serving's device carries ROSE's
    binding condition as the whole serving device does (:func:`gpu_devices`). Pure."""
    if role not in names.SHARE_ROLES:
        raise ValueError(f"a shareable device's role is one of {sorted(names.SHARE_ROLES)}, got {role!r}")
    memory = gpu.memory_bytes - gpu.memory_bytes % SHARE_MEMORY_STEP  # a whole number of steps
    if memory < 2 * SHARE_MEMORY_STEP:
        raise ValueError(f"GPU {gpu.index} has {gpu.memory_bytes} bytes: a shareable GPU needs at least 2 GiB")
    device: dict[str, Any] = {
        "name": device_name(gpu.index, role),
        "allowMultipleAllocations": True,
        "attributes": {
            names.ATTR_UUID: {"string": f"{gpu.uuid}-{role}"},
            names.ATTR_INDEX: {"int": gpu.index},
            names.ATTR_MODEL: {"string": gpu.model[:64]},
            names.ATTR_ROLE: {"string": role},
            names.ATTR_PHYSICAL_GPU: {"string": gpu.uuid},
        },
        "capacity": {
            names.CAPACITY_MEMORY: {
                "value": str(memory),
                "requestPolicy": {
                    "default": str(SHARE_MEMORY_STEP),
                    "validRange": {"min": str(SHARE_MEMORY_STEP), "step": str(SHARE_MEMORY_STEP)},
                },
            },
            names.CAPACITY_COMPUTE: {
                "value": str(SHARE_COMPUTE_TOTAL),
                "requestPolicy": {
                    "default": str(SHARE_COMPUTE_STEP),
                    "validRange": {"min": str(SHARE_COMPUTE_STEP), "step": str(SHARE_COMPUTE_STEP)},
                },
            },
        },
    }
    if binding_conditions and role == names.ROLE_SERVING_SHARE:
        _with_binding_conditions(device)
    return device


def _with_binding_conditions(device: dict[str, Any]) -> None:
    """ROSE's binding condition and its failure twin (the API requires one beside the other)."""
    device["bindingConditions"] = [names.BINDING_CONDITION_FREED]
    device["bindingFailureConditions"] = [names.BINDING_CONDITION_FREE_FAILED]


def gpu_devices(gpus: list[GpuInfo], binding_conditions: bool = False, shares: bool = False) -> list[dict[str, Any]]:
    """The ``spec.devices`` list for these GPUs: serving devices first (first-fit allocator).

    With ``binding_conditions`` every *serving* device (whole, and serving's fraction device
    ``gpu-N-servingshare``) carries ROSE's binding condition (and its
    failure twin, which the API requires beside it): the scheduler then holds a serving pod in
    PreBind until the driver has freed the GPU of any lent occupant. With ``shares``
    every GPU also gets its shareable devices (:func:`share_device`: the RL share device, then
    serving's), after the others."""
    devices: list[dict[str, Any]] = []
    for role in (names.ROLE_SERVING, names.ROLE_LENDABLE):
        for gpu in sorted(gpus, key=lambda g: g.index):
            device: dict[str, Any] = {
                "name": device_name(gpu.index, role),
                "attributes": {
                    names.ATTR_UUID: {"string": f"{gpu.uuid}-{role}"},
                    names.ATTR_INDEX: {"int": gpu.index},
                    names.ATTR_MODEL: {"string": gpu.model[:64]},
                    names.ATTR_ROLE: {"string": role},
                    names.ATTR_PHYSICAL_GPU: {"string": gpu.uuid},
                },
                "capacity": {names.CAPACITY_MEMORY: {"value": str(gpu.memory_bytes)}},
            }
            if binding_conditions and role == names.ROLE_SERVING:
                _with_binding_conditions(device)
            devices.append(device)
    if shares:
        for role in (names.ROLE_SHARE, names.ROLE_SERVING_SHARE):
            devices += [share_device(g, role, binding_conditions) for g in sorted(gpus, key=lambda g: g.index)]
    return devices


def _retaint(
    devices: list[dict[str, Any]], keys: tuple[str, ...], added: Callable[[Mapping[str, Any]], list[dict[str, str]]]
) -> list[dict[str, Any]]:
    """A copy of ``devices`` whose taints with a key in ``keys`` are replaced by ``added(device)``;
    a device's other taints are kept, and a device left with none has no ``taints`` field. Pure."""
    out: list[dict[str, Any]] = []
    for d in devices:
        d = dict(d)
        taints = [t for t in d.get("taints") or [] if t.get("key") not in keys] + added(d)
        if taints:
            d["taints"] = taints
        else:
            d.pop("taints", None)
        out.append(d)
    return out


def taint_serving_held(devices: list[dict[str, Any]], held: frozenset[int]) -> list[dict[str, Any]]:
    """A copy of ``devices`` where the *lendable* and *share* devices of every GPU index in ``held``
    carry the ``NoSchedule`` taint :data:`names.TAINT_SERVING_HOLDS` (value: the GPU index), so the
    scheduler allocates no new lent claim on a GPU serving holds. Serving devices are never tainted; a
    device's other taints are kept. Pure."""

    def added(d: Mapping[str, Any]) -> list[dict[str, str]]:
        if not d["name"].endswith((f"-{names.ROLE_LENDABLE}", f"-{names.ROLE_SHARE}")):
            return []
        index, _ = parse_device_name(d["name"])
        return (
            [{"key": names.TAINT_SERVING_HOLDS, "value": str(index), "effect": "NoSchedule"}] if index in held else []
        )

    return _retaint(devices, (names.TAINT_SERVING_HOLDS,), added)


def taint_lent_held(
    devices: list[dict[str, Any]],
    shared: frozenset[int],
    whole: frozenset[int],
    fractions: frozenset[int] = frozenset(),
) -> list[dict[str, Any]]:
    """A copy of ``devices`` where the *lendable* device of every GPU index in ``shared`` (shares
    are prepared there) carries the ``NoSchedule`` taint :data:`names.TAINT_SHARES_HOLD` and the
    *share* device of every GPU index in ``whole`` (a whole lendable claim is prepared there)
    carries :data:`names.TAINT_LENT_WHOLE`: the scheduler then never books one GPU both whole and
    in shares. Serving's shareable device of a GPU lent whole carries :data:`names.TAINT_LENT_WHOLE`
    too: a serving fraction claim that asks first for an untainted device (its first subrequest,
    ``examples/serving-share-claim-template.yaml``) lands where it reclaims a share, not a whole-GPU
    occupant. The *serving* device of every GPU index in ``fractions`` (serving's fractions are
    prepared there) carries :data:`names.TAINT_SERVING_FRACTIONS`, so no whole serving claim is
    allocated where the driver would refuse it. A device's other taints are kept. Pure."""

    def added(d: Mapping[str, Any]) -> list[dict[str, str]]:
        index, role = parse_device_name(d["name"])
        if role == names.ROLE_LENDABLE and index in shared:
            return [{"key": names.TAINT_SHARES_HOLD, "value": str(index), "effect": "NoSchedule"}]
        if role in names.SHARE_ROLES and index in whole:
            return [{"key": names.TAINT_LENT_WHOLE, "value": str(index), "effect": "NoSchedule"}]
        if role == names.ROLE_SERVING and index in fractions:
            return [{"key": names.TAINT_SERVING_FRACTIONS, "value": str(index), "effect": "NoSchedule"}]
        return []

    keys = (names.TAINT_SHARES_HOLD, names.TAINT_LENT_WHOLE, names.TAINT_SERVING_FRACTIONS)
    return _retaint(devices, keys, added)


def taint_covers(devices: list[dict[str, Any]], index: int) -> list[str]:
    """The devices a reclaim taint on GPU ``index`` covers: its lendable device and every share
    device of it (however many), found by each device's own ``role`` and ``index`` attributes; never
    a serving device (serving is what a reclaim makes room for). In ``devices``' order. Pure."""
    out: list[str] = []
    for d in devices:
        attrs = d.get("attributes") or {}
        role = (attrs.get(names.ATTR_ROLE) or {}).get("string")
        if role in names.LENT_ROLES and (attrs.get(names.ATTR_INDEX) or {}).get("int") == index:
            out.append(str(d["name"]))
    return out


def taint_reclaim_planned(
    devices: list[dict[str, Any]], planned: Mapping[int, Mapping[str, str]], ruled: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """A copy of ``devices`` where every device :func:`taint_covers` gives for a GPU index in
    ``planned`` carries that GPU's reclaim taint (``planned[index]``: key
    :data:`names.TAINT_RECLAIM_PLANNED`, value, effect), except the devices in ``ruled`` (a
    DeviceTaintRule already taints those). Earlier ``rose.io/reclaim-planned`` taints in the slice
    are dropped, a device's other taints kept: a GPU gains and loses it on all its lent devices
    together. Pure."""
    covered: dict[str, dict[str, str]] = {}
    for index, taint in planned.items():
        if taint.get("key") != names.TAINT_RECLAIM_PLANNED:
            raise ValueError(f"GPU {index}: not a {names.TAINT_RECLAIM_PLANNED} taint: {dict(taint)!r}")
        for name in taint_covers(devices, index):
            if name not in ruled:
                covered[name] = {"key": taint["key"], "value": taint.get("value", ""), "effect": taint["effect"]}
    return _retaint(
        devices, (names.TAINT_RECLAIM_PLANNED,), lambda d: [covered[d["name"]]] if d["name"] in covered else []
    )


def resource_slice(
    node_name: str, gpus: list[GpuInfo], generation: int, binding_conditions: bool = False, shares: bool = False
) -> dict[str, Any]:
    """One ResourceSlice (resource.k8s.io/v1) holding a node's whole pool.

    At most 128 devices fit a slice; two per GPU allows 64 GPUs per node (four with ``shares``, the
    RL share and serving's fraction: 32), far above any real node. Larger inputs are refused rather
    than silently split.
    """
    per_gpu = 4 if shares else 2
    if len(gpus) > 128 // per_gpu:
        raise ValueError(f"{len(gpus)} GPUs on node {node_name}: at most {128 // per_gpu} fit one ResourceSlice")
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node_name}-{names.DRIVER_NAME}".replace(".", "-")},
        "spec": {
            "driver": names.DRIVER_NAME,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": gpu_devices(gpus, binding_conditions, shares),
        },
    }


def simulated_gpus(
    node_name: str, count: int, model: str = "NVIDIA H200 (simulated)", memory_bytes: int = 141 * 1024**3
) -> list[GpuInfo]:
    """Deterministic simulated GPUs for a node (uuid derived from node name and index)."""
    import hashlib

    out = []
    for i in range(count):
        h = hashlib.sha256(f"{node_name}/{i}".encode()).hexdigest()
        uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        out.append(GpuInfo(index=i, uuid=uuid, model=model, memory_bytes=memory_bytes))
    return out
