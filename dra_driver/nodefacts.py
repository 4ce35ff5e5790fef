"""Node facts the scheduler extender reads, published as Node annotations (ARCHITECTURE §3).

* ``rose.io/host-memory-free-bytes``: the host-memory budget for suspended state minus what the
  node's suspended occupants hold in DRAM (the extender's cache reads it);
* ``rose.io/host-state-disk-free-bytes``: with a disk tier (``--spill-dir``), its budget minus what
  spilled state holds there (the extender adds it to the above);
* ``rose.io/lent-gpus``: comma-separated indexes of GPUs lent *whole* (a prepared lendable claim),
  suspended or not ("" when none);
* ``rose.io/lent-gpu-shares``: the GPUs lent in RL shares, ``<index>=<fraction>`` comma-separated
  ("" when none): the fraction of the GPU its prepared shares (suspended or not) hold, the larger
  of their summed memory over the GPU's memory and their summed compute over 100 %
  (``rose_common.slices.share_fraction``), rounded *up* to 0.01 so a reader never counts less
  lent than is. A GPU with only shares is not in ``lent-gpus``.

:func:`node_facts` is pure; :class:`NodeFactsPublisher` patches the Node only when they change.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Protocol

from dra_driver.claims import PreparedDevice
from dra_driver.state import CHECKPOINTED_EVICTED, ENFORCED_EVICTED, PREPARE_COMPLETED, NodeStateData
from rose_common import names
from rose_common.lentfacts import format_shares
from rose_common.slices import share_fraction

log = logging.getLogger("rose.driver.nodefacts")


def node_facts(
    data: NodeStateData,
    host_memory_budget_bytes: int,
    spill: tuple[int, int] | None = None,
    gpu_memory: Mapping[int, int] | None = None,
) -> dict[str, str]:
    """``spill``: the disk tier's (budget, held) bytes; None without one. What the suspended
    occupants hold counts in DRAM except what the disk tier holds. ``gpu_memory``: each GPU's
    memory bytes (a share's memory fraction; without it only compute counts)."""
    held = sum(
        s.bytes_moved for s in data.suspensions.values() if s.state not in (CHECKPOINTED_EVICTED, ENFORCED_EVICTED)
    )
    if spill is not None:
        held = max(0, held - spill[1])
    devices = [d for r in data.claims.values() if r.state == PREPARE_COMPLETED for d in r.devices]
    whole = sorted({d.gpu_index for d in devices if d.role == names.ROLE_LENDABLE})
    out = {
        names.ANNOTATION_HOST_MEM_FREE: str(max(0, host_memory_budget_bytes - held)),
        names.ANNOTATION_LENT: ",".join(str(i) for i in whole),
        names.ANNOTATION_LENT_SHARES: format_shares(lent_fractions(devices, gpu_memory or {})),
    }
    if spill is not None:
        out[names.ANNOTATION_SPILL_FREE] = str(max(0, spill[0] - spill[1]))
    return out


def lent_fractions(devices: list[PreparedDevice], gpu_memory: Mapping[int, int]) -> dict[int, float]:
    """Per GPU index: the fraction of it the RL shares among ``devices`` hold (at most 1.0)."""
    memory: dict[int, int] = {}
    compute: dict[int, int] = {}
    for d in devices:
        if d.role == names.ROLE_SHARE:
            memory[d.gpu_index] = memory.get(d.gpu_index, 0) + d.memory_bytes
            compute[d.gpu_index] = compute.get(d.gpu_index, 0) + d.compute_percent
    return {i: min(1.0, share_fraction(memory[i], compute[i], gpu_memory.get(i, 0))) for i in memory}


class NodeApi(Protocol):
    def annotate(self, annotations: dict[str, str]) -> None: ...


class NodeFactsPublisher:
    def __init__(self, api: NodeApi, facts: Callable[[], dict[str, str]], period_seconds: float = 5.0) -> None:
        self.api = api
        self.facts = facts
        self.period = period_seconds
        self.last: dict[str, str] | None = None
        self._stop = threading.Event()

    def publish(self) -> bool:
        """Patch the Node if the facts changed; whether it wrote."""
        now = self.facts()
        if now == self.last:
            return False
        self.api.annotate(now)
        self.last = now
        log.info("node facts published", extra=dict(now))
        return True

    def run(self) -> None:
        while True:
            try:
                self.publish()
            except Exception as e:
                log.warning("publishing node facts failed", extra={"err": repr(e)})
            if self._stop.wait(self.period):
                return

    def start(self) -> None:
        threading.Thread(target=self.run, name="node-facts", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
