"""Demo act 3, continued: when host memory is full, suspended state spills to disk, not evicted.

A real ``rose driver`` for act 3's node (simulated GPUs, the suspend engine's explicit
``simulated`` backend holding real bytes: each lent claim's device memory is a file of random
bytes), with a DRAM budget that holds one suspended occupant and a disk tier (``--spill-dir``).
Two lent GPUs are taken by RL occupants, then serving arrives on both: the first occupant is
suspended into DRAM; the second does not fit, so the first one's DRAM copy spills to disk
(checksummed chunks) instead of anything being evicted. Serving leaves GPU 2: the spilled occupant
resumes from disk, and its device memory is compared byte for byte with what it was when it was
suspended. The demo plays the kubelet's prepare / unprepare, as act 3 does.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from local_cluster import ClusterHandle, free_port
from local_cluster.kubelet import DriverProcess
from local_cluster.objects import (
    allocated_claim,
    claim_template,
    create_claim_template,
    delete_namespace,
    gpu_pod,
    new_namespace,
    wait_for,
)
from rose_common import names

MiB = 1 << 20
OCCUPANT = 48 * MiB  # each RL occupant's suspended state
DRAM = 64 * MiB  # the host-memory budget: one occupant fits, two do not
DISK = 256 * MiB  # the disk tier's budget
GPUS = (2, 3)  # act 3 used GPUs 0 and 1 of this node


def _digest(p: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(p, "rb") as f:
        while b := f.read(8 * MiB):
            h.update(b)
    return h.hexdigest()


def _host_dir(node: str) -> Path:
    """Where the driver's simulated backend keeps device memory and DRAM copies (a tmpfs folder
    per node: ``dra_driver.suspend.factory``)."""
    return Path("/dev/shm") / f"rose-simulated-host-{node}"


def _start(h: ClusterHandle, node: str, root: Path) -> DriverProcess:
    args = [
        "--suspend-engine", "node", "--suspend-backends", "simulated",
        "--simulated-occupant-bytes", str(OCCUPANT), "--host-memory-budget", str(DRAM),
        "--spill-dir", str(root / "spill"), "--spill-budget-bytes", str(DISK),
        "--default-grace-seconds", "10",
        # the played kubelet's prepare moves the state here; act 3 showed the PreBind wait
        "--serving-wait", "prepare",
    ]  # fmt: skip
    return DriverProcess(h.kubeconfig, node, root, h.gpus_per_node, free_port(), extra_args=args)


def _allocated(api: Any, ns: str, pod: str) -> dict[str, Any]:
    return wait_for(f"{pod}'s claim allocated", lambda: allocated_claim(api, ns, pod), timeout=90)


def _occupy_then_serve(api: Any, ns: str, node: str) -> tuple[dict[int, Any], dict[int, Any]]:
    """Lent claims on ``GPUS`` with RL pods, then serving pods on the same GPUs; the claims as the
    scheduler allocated them."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    for gpu in GPUS:
        sel = [f'device.attributes["gpu.rose.io"].index == {gpu}']
        create_claim_template(api, ns, claim_template(f"lent-{gpu}", names.DEVICE_CLASS_LENDABLE, selectors=sel))
        create_claim_template(api, ns, claim_template(f"serve-{gpu}", names.DEVICE_CLASS_SERVING, selectors=sel))
        rl = gpu_pod(f"rl-{gpu}", f"lent-{gpu}", labels={names.LABEL_JOB: "spill"}, node_name=node)
        core.create_namespaced_pod(ns, rl)
    lent = {g: _allocated(api, ns, f"rl-{g}") for g in GPUS}
    for gpu in GPUS:
        srv = gpu_pod(f"srv-{gpu}", f"serve-{gpu}", labels={names.LABEL_ROLE: "serving"}, node_name=node)
        core.create_namespaced_pod(ns, srv)
    serve = {g: _allocated(api, ns, f"srv-{g}") for g in GPUS}
    return lent, serve


def _tiers(drv: DriverProcess) -> str:
    dram = drv.metric("rose_driver_host_state_bytes", {"tier": "dram"})
    disk = drv.metric("rose_driver_host_state_bytes", {"tier": "disk"})
    return f"DRAM {dram / MiB:.0f} MiB, disk {disk / MiB:.0f} MiB"


def _spill_and_back(
    drv: DriverProcess, host: Path, lent: dict[int, Any], serve: dict[int, Any], say: Callable[[str], None]
) -> bool:
    """Serving takes both GPUs (the second suspend spills the first occupant), then leaves the
    first GPU (its occupant resumes from disk). True when nothing was evicted and the resumed
    device memory is bit-identical to what was suspended."""
    a, b = GPUS
    for gpu in GPUS:
        assert drv.kubelet.prepare(lent[gpu]).error == ""
    assert drv.kubelet.prepare(serve[a]).error == ""
    (copy,) = list((host / "dram").iterdir())  # occupant a's DRAM copy, the bytes it had
    before = _digest(copy)
    say(
        f"   · serving takes GPU {a}: its RL occupant is suspended into host memory ({_tiers(drv)} of a "
        f"{DRAM // MiB} MiB budget)"
    )
    err = drv.kubelet.prepare(serve[b]).error
    spilled = drv.metric("rose_suspend_spills_total", {"direction": "to_disk", "result": "ok"})
    evicted = drv.metric("rose_driver_occupant_suspend_total", {"outcome": "checkpoint_evict"})
    say(
        f"   · serving takes GPU {b} (error {err!r}): its occupant does not fit the budget, so GPU {a}'s "
        f"suspended state spilled to disk instead of evicting anyone: {_tiers(drv)}; spills {spilled:.0f}, "
        f"checkpoint-and-evict {evicted:.0f}"
    )
    assert drv.kubelet.unprepare(serve[a]).error == ""
    restored = drv.metric("rose_suspend_spills_total", {"direction": "to_dram", "result": "ok"})
    after = _digest(host / "device" / copy.name)
    same = after == before
    say(
        f"   · serving leaves GPU {a}: its occupant resumed from disk (every chunk's blake2b verified; "
        f"restores {restored:.0f}), {_tiers(drv)}; device memory bit-identical to before the suspend: "
        f"{'yes' if same else 'NO'}"
    )
    assert drv.kubelet.unprepare(serve[b]).error == ""
    for gpu in GPUS:
        assert drv.kubelet.unprepare(lent[gpu]).error == ""
    return err == "" and spilled == 1 and evicted == 0 and restored == 1 and same


def act_spill(h: ClusterHandle, api: Any, say: Callable[[str], None]) -> bool:
    """Returns True when the full DRAM budget spilled to disk, nothing was evicted, and the spilled
    occupant resumed bit-identical."""
    node = h.node_names[0]
    root = Path(tempfile.mkdtemp(prefix="rose-demo-spill-", dir="/tmp"))  # unix socket paths stay short
    shutil.rmtree(_host_dir(node), ignore_errors=True)
    drv = _start(h, node, root)
    ns = new_namespace(api, "demo-spill")
    try:
        say(
            f"   · `rose driver` for {node} with a {DRAM // MiB} MiB host-memory budget and a "
            f"{DISK // MiB} MiB disk tier; two RL occupants of {OCCUPANT // MiB} MiB (the simulated backend's "
            f"real bytes)"
        )
        lent, serve = _occupy_then_serve(api, ns, node)
        ok = _spill_and_back(drv, _host_dir(node), lent, serve, say)
        say(f"   · host memory full -> spilled to disk, not evicted; resumed bit-exact: {'YES' if ok else 'NO'}")
        return ok
    finally:
        delete_namespace(api, ns)
        drv.stop()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(_host_dir(node), ignore_errors=True)
