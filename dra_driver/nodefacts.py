"""Node facts the scheduler extender reads, published as Node annotations (ARCHITECTURE §3).

* ``rose.io/host-memory-free-bytes``: the host-memory budget for suspended state minus what the
  node's suspended occupants hold in DRAM (the extender's cache reads it);
* ``rose.io/host-state-disk-free-bytes``: with a disk tier (``--spill-dir``), its budget minus what
  spilled state holds there (the extender adds it to the above);
* ``rose.io/lent-gpus``: comma-separated indexes of GPUs with a prepared lent (lendable) claim,
  suspended or not ("" when none).

:func:`node_facts` is pure; :class:`NodeFactsPublisher` patches the Node only when they change.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from dra_driver.state import CHECKPOINTED_EVICTED, ENFORCED_EVICTED, PREPARE_COMPLETED, NodeStateData
from rose_common import names

log = logging.getLogger("rose.driver.nodefacts")


def node_facts(
    data: NodeStateData, host_memory_budget_bytes: int, spill: tuple[int, int] | None = None
) -> dict[str, str]:
    """``spill``: the disk tier's (budget, held) bytes; None without one. What the suspended
    occupants hold counts in DRAM except what the disk tier holds."""
    held = sum(
        s.bytes_moved for s in data.suspensions.values() if s.state not in (CHECKPOINTED_EVICTED, ENFORCED_EVICTED)
    )
    if spill is not None:
        held = max(0, held - spill[1])
    lent = sorted(
        {
            d.gpu_index
            for r in data.claims.values()
            if r.state == PREPARE_COMPLETED
            for d in r.devices
            if d.role in names.LENT_ROLES  # a GPU lent in shares is lent too
        }
    )
    out = {
        names.ANNOTATION_HOST_MEM_FREE: str(max(0, host_memory_budget_bytes - held)),
        names.ANNOTATION_LENT: ",".join(str(i) for i in lent),
    }
    if spill is not None:
        out[names.ANNOTATION_SPILL_FREE] = str(max(0, spill[0] - spill[1]))
    return out


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
