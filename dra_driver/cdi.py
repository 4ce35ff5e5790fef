"""Per-claim CDI specs (CONTRACTS §D): one transient spec file per claim UID.

Runtimes cache specs, so the spec name is unique per claim: ``gpu.rose.io-gpu_<claimUID>.json``
in the dynamic CDI directory (``/var/run/cdi``). Writes are atomic (temp, fsync, rename).
Each spec injects ``ROSE_CLAIM_UID_<UID>=<UID>`` (``rose_common.names.claim_uid_env``: one
variable per claim, since a container may hold several claims) and ``ROSE_SIMULATED_GPU``.
A lent claim's spec also mounts the claim's own node-agent socket directory at
``/run/rose/claims/<UID>`` and sets ``ROSE_AGENT_SOCKET`` to the socket in it: the workload's
identity is the socket it reaches, so pods need no hostPath. On simulated GPUs that directory also
holds the claim's simulated device memory (``ROSE_SIMULATED_DEVICE_MEMORY``,
``dra_driver.suspend.devicewatch``). With the driver's disk tier on, a lent claim's spec also
mounts the claim's own spill directory at ``/run/rose/spill/<UID>`` and sets ``ROSE_SPILL_DIR``
to it: a cooperative workload in its own container writes its spill file there (the driver
creates the file and names it as the container sees it). I/O boundary: the CDI directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_driver import shares
from dra_driver.claims import CDI_CLASS, CDI_KIND, CDI_VENDOR, PreparedDevice, cdi_device_name
from dra_driver.suspend.spill import ENV_SPILL_DIR, container_spill_dir
from rose_common import names
from rose_common.atomic import atomic_write

CDI_VERSION = "0.6.0"  # annotations need 0.6.0; env and deviceNodes need less
SPEC_PREFIX = f"{CDI_VENDOR}-{CDI_CLASS}_"
CONTAINER_SOCKET_ROOT = "/run/rose/claims"
AGENT_SOCKET_NAME = "workload.sock"
ENV_AGENT_SOCKET = "ROSE_AGENT_SOCKET"


def agent_socket_edits(claim_uid: str, host_dir: Path) -> dict[str, Any]:
    """Pure: the container edits that hand a claim's containers its node-agent socket."""
    container_dir = f"{CONTAINER_SOCKET_ROOT}/{claim_uid}"
    return {
        "env": [f"{ENV_AGENT_SOCKET}={container_dir}/{AGENT_SOCKET_NAME}"],
        "mounts": [_dir_mount(host_dir, container_dir)],
    }


def _dir_mount(host_dir: Path, container_dir: str) -> dict[str, Any]:
    """Pure: a host directory bind-mounted read-write, with no devices, setuid or executables."""
    return {
        "hostPath": str(host_dir),
        "containerPath": container_dir,
        "options": ["rbind", "rw", "nosuid", "nodev", "noexec"],
    }


def spill_dir_edits(claim_uid: str, host_dir: Path) -> dict[str, Any]:
    """Pure: the container edits that hand a claim's containers its spill directory (the disk
    tier's ``claims/<UID>``): mounted at ``/run/rose/spill/<UID>``, named by ``ROSE_SPILL_DIR``."""
    if not host_dir.is_absolute():
        raise ValueError(f"claim {claim_uid}: the spill directory must be an absolute host path, got {host_dir}")
    container_dir = container_spill_dir(claim_uid)
    return {"env": [f"{ENV_SPILL_DIR}={container_dir}"], "mounts": [_dir_mount(host_dir, container_dir)]}


def spec_filename(claim_uid: str) -> str:
    return f"{SPEC_PREFIX}{claim_uid}.json"


def build_spec(
    claim_uid: str,
    devices: list[PreparedDevice],
    minors: dict[int, int],
    simulated: bool,
    *,
    agent_socket_dir: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    mps_root: Path | None = None,
    spill_dir: Path | None = None,
) -> dict[str, Any]:
    """The CDI spec for one claim. ``minors`` maps GPU index → /dev/nvidia<minor>;
    ``agent_socket_dir``: the host directory of the claim's node-agent socket, mounted when given;
    ``extra_env``: more variables for every container (e.g. ``ROSE_SIMULATED_DEVICE_MEMORY``, a
    share's CUDA MPS settings: ``dra_driver.shares.mps_env``); ``mps_root``: where the node's MPS
    daemons keep their directories (``dra_driver.mps``; a GPU node): a share's GPU's are mounted;
    ``spill_dir``: the host directory of the claim's spill directory (the disk tier), mounted when given."""
    if not devices:
        raise ValueError(f"claim {claim_uid}: a CDI spec needs at least one device")
    cdi_devices: list[dict[str, Any]] = []
    for d in devices:
        env = [
            f"ROSE_GPU_UUID={d.gpu_uuid}",
            f"ROSE_GPU_ROLE={d.role}",
            f"NVIDIA_VISIBLE_DEVICES={d.gpu_uuid}",
        ]
        edits: dict[str, Any] = {"env": env}
        if not simulated:
            edits["deviceNodes"] = [{"path": f"/dev/nvidia{minors.get(d.gpu_index, d.gpu_index)}"}]
        cdi_devices.append({"name": cdi_device_name(claim_uid, d.device), "containerEdits": edits})
    common: dict[str, Any] = {"env": [names.claim_uid_env(claim_uid), f"{names.ENV_SIMULATED_GPU}={int(simulated)}"]}
    if not simulated:
        common["deviceNodes"] = [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}]
    if agent_socket_dir is not None:
        edits = agent_socket_edits(claim_uid, agent_socket_dir)
        common["env"] += edits["env"]
        common["mounts"] = edits["mounts"]
    if spill_dir is not None:
        edits = spill_dir_edits(claim_uid, spill_dir)
        common["env"] += edits["env"]
        common["mounts"] = [*common.get("mounts", []), *edits["mounts"]]
    common["env"] += [f"{k}={v}" for k, v in sorted((extra_env or {}).items())]
    if mps_root is not None and (mounts := shares.mps_mounts(devices, mps_root)):
        common["mounts"] = [*common.get("mounts", []), *mounts]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "annotations": {"gpu.rose.io/claim-uid": claim_uid},
        "devices": cdi_devices,
        "containerEdits": common,
    }


def write_spec(cdi_dir: Path, claim_uid: str, spec: dict[str, Any]) -> Path:
    path = cdi_dir / spec_filename(claim_uid)
    atomic_write(path, (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode(), mode=0o644)
    return path


def delete_spec(cdi_dir: Path, claim_uid: str) -> bool:
    path = cdi_dir / spec_filename(claim_uid)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def list_specs(cdi_dir: Path) -> list[str]:
    """Claim UIDs that have a spec file of ours in ``cdi_dir``."""
    if not cdi_dir.is_dir():
        return []
    return sorted(
        n[len(SPEC_PREFIX) : -len(".json")]
        for n in os.listdir(cdi_dir)
        if n.startswith(SPEC_PREFIX) and n.endswith(".json")
    )
