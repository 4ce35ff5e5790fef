"""GPU shares (issue 27 §3): pure prepare-time accounting and the CUDA MPS settings of a share.

With ``--gpu-shares`` every GPU is published a third time, as ``gpu-N-share`` with
``allowMultipleAllocations`` and the consumable capacities ``memory`` and ``compute``
(``rose_common.slices.share_device``). The scheduler sums ``consumedCapacity`` over the share
claims of that one device, but it does not know that ``gpu-N-share``, ``gpu-N-lendable`` and
``gpu-N-serving`` are the same GPU. The driver therefore keeps one rule per GPU at prepare time
(:func:`share_conflict`):

* a share and a whole-GPU *lent* claim never share a GPU: a share claim is refused while a
  lendable claim is prepared on its GPU, and the other way round (the kubelet retries);
* the shares prepared on one GPU never add up to more than its memory or 100 % compute (the
  scheduler's own accounting, checked again against what this node actually has);
* serving wins over shares exactly as over lendable claims: a share is a lent role
  (``names.LENT_ROLES``), so a serving prepare suspends the GPU's share occupants first;
* serving may itself take a fraction of a GPU (``gpu-N-servingshare``, DeviceClass
  ``serving-share.gpu.rose.io``): the scheduler sums serving's fractions on that device only, and
  the driver makes room beside them by reclaiming the GPU's RL shares, largest first, until the rest
  fit (:func:`reclaim_for_serving`), and every whole-GPU lent claim there.

No I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

from dra_driver.claims import PreparedDevice
from rose_common import names
from rose_common.slices import SHARE_COMPUTE_TOTAL

# Where a share's containers see its GPU's MPS daemon directories (CDI mounts of the host's
# <state-dir>/mps/gpu-<N>/{pipe,log}: dra_driver.mps, one daemon per shared GPU)
MPS_CONTAINER_PIPE_DIR = "/run/nvidia/mps/pipe"
MPS_CONTAINER_LOG_DIR = "/run/nvidia/mps/log"


def share_conflict(
    dev: PreparedDevice,
    prepared: Iterable[tuple[str, PreparedDevice]],
    gpu_memory_bytes: int,
) -> str | None:
    """Why the device ``dev`` of a claim being prepared cannot join the devices already prepared
    on this node (``(claim key, device)`` pairs of *other* claims), or ``None``. Covers only the
    share rules; serving against lent claims is the node's own check (a serving fraction is never
    refused for the RL shares on its GPU: it reclaims them, :func:`reclaim_for_serving`)."""
    same_gpu = [(k, d) for k, d in prepared if d.gpu_index == dev.gpu_index]
    if dev.role == names.ROLE_LENDABLE:
        shares = sorted(k for k, d in same_gpu if d.role in names.SHARE_ROLES)
        if shares:
            return (
                f"GPU {dev.gpu_index} is shared by share claims {', '.join(shares)}; a whole-GPU lent claim "
                "can be prepared only after they are unprepared (the kubelet retries)"
            )
        return None
    if dev.role in names.SERVING_ROLES:
        return _serving_conflict(dev, same_gpu, gpu_memory_bytes)
    if dev.role != names.ROLE_SHARE:
        return None
    lent = sorted(k for k, d in same_gpu if d.role == names.ROLE_LENDABLE)
    if lent:
        return (
            f"GPU {dev.gpu_index} is lent whole to claim {', '.join(lent)}; a share can be prepared only "
            "after it is unprepared (the kubelet retries)"
        )
    # serving's fractions count too: a share is prepared only into what serving leaves free
    others = [d for _, d in same_gpu if d.role in names.SHARE_ROLES]
    return _over_capacity(dev, others, gpu_memory_bytes, "shares")


def _serving_conflict(
    dev: PreparedDevice, same_gpu: list[tuple[str, PreparedDevice]], gpu_memory_bytes: int
) -> str | None:
    """A serving device beside the other serving claims of its GPU: a whole serving device and a
    serving fraction never share a GPU, and serving's fractions stay within the GPU."""
    other = names.ROLE_SERVING_SHARE if dev.role == names.ROLE_SERVING else names.ROLE_SERVING
    clash = sorted(k for k, d in same_gpu if d.role == other)
    if clash:
        return (
            f"GPU {dev.gpu_index} is held by serving claim {', '.join(clash)} ({other}); serving's whole "
            "device and serving's fractions never share a GPU (the kubelet retries)"
        )
    if dev.role != names.ROLE_SERVING_SHARE:
        return None
    return _over_capacity(dev, [d for _, d in same_gpu if d.role == dev.role], gpu_memory_bytes, "serving fractions")


def _over_capacity(dev: PreparedDevice, others: list[PreparedDevice], gpu_memory_bytes: int, what: str) -> str | None:
    memory = dev.memory_bytes + sum(d.memory_bytes for d in others)
    compute = dev.compute_percent + sum(d.compute_percent for d in others)
    if memory > gpu_memory_bytes:
        return (
            f"the {what} of GPU {dev.gpu_index} would hold {memory} bytes of its {gpu_memory_bytes} "
            f"({len(others)} prepared + this one of {dev.memory_bytes}): over its memory"
        )
    if compute > SHARE_COMPUTE_TOTAL:
        return (
            f"the {what} of GPU {dev.gpu_index} would hold {compute} % compute ({len(others)} prepared + "
            f"this one of {dev.compute_percent} %): over 100 %"
        )
    return None


class Capacity(Protocol):
    """What a serving fraction holds of its GPU: a prepared device's, or an allocation's being bound
    (``binding.Fraction``)."""

    @property
    def memory_bytes(self) -> int: ...
    @property
    def compute_percent(self) -> int: ...


def reclaim_for_serving(
    gpu_memory_bytes: int,
    serving: Iterable[Capacity],
    lent: Iterable[tuple[str, PreparedDevice]],
) -> list[str]:
    """Which lent claims on one GPU serving's fractions there (``serving``: every ``servingshare``
    device of the GPU, the one being prepared included, and with ``--serving-wait=prebind`` the
    fractions allocated there and being bound) must reclaim: every whole-GPU lendable
    claim, and of the RL shares (``(claim uid, device)``) the largest first — memory, then compute,
    then uid — until the rest fit beside serving in the GPU's memory and 100 % compute. A share
    already suspended counts like a running one: its claim still holds that capacity, and when a
    serving fraction leaves, the shares it reclaimed resume into what it frees. Pure."""
    srv = list(serving)
    free_memory = gpu_memory_bytes - sum(d.memory_bytes for d in srv)
    free_compute = SHARE_COMPUTE_TOTAL - sum(d.compute_percent for d in srv)
    pairs = list(lent)
    out = sorted({uid for uid, d in pairs if d.role == names.ROLE_LENDABLE})
    shares = sorted(
        ((uid, d) for uid, d in pairs if d.role == names.ROLE_SHARE),
        key=lambda p: (-p[1].memory_bytes, -p[1].compute_percent, p[0]),
    )
    memory = sum(d.memory_bytes for _, d in shares)
    compute = sum(d.compute_percent for _, d in shares)
    for uid, d in shares:
        if memory <= free_memory and compute <= free_compute:
            break
        out.append(uid)
        memory -= d.memory_bytes
        compute -= d.compute_percent
    return list(dict.fromkeys(out))


def share_usage(prepared: Iterable[PreparedDevice]) -> dict[int, tuple[int, int, int]]:
    """Per GPU index: (share claims, memory bytes, compute percent) of the prepared shares."""
    out: dict[int, tuple[int, int, int]] = {}
    for d in prepared:
        if d.role == names.ROLE_SHARE:
            n, m, c = out.get(d.gpu_index, (0, 0, 0))
            out[d.gpu_index] = (n + 1, m + d.memory_bytes, c + d.compute_percent)
    return out


def mps_env(devices: Iterable[PreparedDevice]) -> dict[str, str]:
    """The CUDA MPS client settings for a claim's share devices (empty when it has none).

    Inside the container the claim's GPUs are numbered from 0 in the order of its devices
    (``NVIDIA_VISIBLE_DEVICES``), so the pinned memory limit names ordinals: ``0=20480M``.
    MiB, rounded down: MPS takes the limit as a ceiling the client may not exceed."""
    devs = list(devices)
    shares = [(i, d) for i, d in enumerate(devs) if d.role in names.SHARE_ROLES]
    if not shares:
        return {}
    limits = ",".join(f"{i}={d.memory_bytes // 2**20}M" for i, d in shares)
    # one thread percentage per client process: the smallest share's (a claim rarely holds two)
    percent = min(d.compute_percent for _, d in shares)
    return {
        names.ENV_MPS_MEM_LIMIT: limits,
        names.ENV_MPS_THREAD_PERCENTAGE: str(percent),
        names.ENV_MPS_PIPE_DIRECTORY: MPS_CONTAINER_PIPE_DIR,
        names.ENV_MPS_LOG_DIRECTORY: MPS_CONTAINER_LOG_DIR,
    }


def mps_mounts(devices: Iterable[PreparedDevice], host_root: Path) -> list[dict[str, object]]:
    """The host directories of the MPS daemon of the (first) shared GPU (``<host_root>/gpu-<N>``,
    ``dra_driver.mps.dirs``), mounted where :func:`mps_env` points the client."""
    gpus = sorted({d.gpu_index for d in devices if d.role in names.SHARE_ROLES})
    if not gpus:
        return []
    host = f"{host_root}/gpu-{gpus[0]}"
    return [
        {"hostPath": f"{host}/pipe", "containerPath": MPS_CONTAINER_PIPE_DIR, "options": ["rbind", "rw"]},
        {"hostPath": f"{host}/log", "containerPath": MPS_CONTAINER_LOG_DIR, "options": ["rbind", "rw"]},
    ]


def over_limit(resident_bytes: Mapping[str, int], limits: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """Simulated enforcement: the share claims whose observed resident bytes (the simulated device
    memory file) exceed their memory limit → (resident, limit)."""
    return {
        uid: (resident_bytes[uid], lim) for uid, lim in limits.items() if lim > 0 and resident_bytes.get(uid, 0) > lim
    }
