from __future__ import annotations

from dra_driver.claims import PreparedDevice
from dra_driver.nodefacts import NodeFactsPublisher, node_facts
from dra_driver.state import (
    CHECKPOINTED_EVICTED,
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    SUSPENDED,
    ClaimRecord,
    NodeStateData,
    Suspension,
)
from rose_common import names


def _rec(uid: str, idx: int, role: str, state: str = PREPARE_COMPLETED) -> ClaimRecord:
    dev = PreparedDevice(("gpu",), "n", f"gpu-{idx}-{role}", (), idx, f"GPU-{idx}", role)
    return ClaimRecord(uid, "ns", uid, state, [dev])


def test_facts_from_state() -> None:
    d = NodeStateData(boot_id="b")
    assert node_facts(d, 100) == {names.ANNOTATION_HOST_MEM_FREE: "100", names.ANNOTATION_LENT: ""}
    d.claims = {
        "a": _rec("a", 3, "lendable"),
        "b": _rec("b", 1, "lendable"),
        "c": _rec("c", 0, "serving"),
        "d": _rec("d", 2, "lendable", PREPARE_STARTED),
    }
    d.suspensions = {
        "a": Suspension("a", SUSPENDED, ["c"], "simulated", 30),
        "b": Suspension("b", CHECKPOINTED_EVICTED, ["x"], "simulated", 50),  # not in host memory
    }
    assert node_facts(d, 100) == {names.ANNOTATION_HOST_MEM_FREE: "70", names.ANNOTATION_LENT: "1,3"}
    d.suspensions["a"].bytes_moved = 500
    assert node_facts(d, 100)[names.ANNOTATION_HOST_MEM_FREE] == "0"


def test_publisher_patches_only_on_change() -> None:
    patches: list[dict[str, str]] = []

    class Api:
        def annotate(self, annotations: dict[str, str]) -> None:
            patches.append(dict(annotations))

    facts = {"k": "1"}
    p = NodeFactsPublisher(Api(), lambda: dict(facts))
    assert p.publish() and not p.publish()
    facts["k"] = "2"
    assert p.publish()
    assert patches == [{"k": "1"}, {"k": "2"}]
