from __future__ import annotations

import pytest

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
from rose_common import lentfacts, names


def _rec(
    uid: str, idx: int, role: str, state: str = PREPARE_COMPLETED, memory: int = 0, compute: int = 0
) -> ClaimRecord:
    dev = PreparedDevice(("gpu",), "n", f"gpu-{idx}-{role}", (), idx, f"GPU-{idx}", role, memory, compute)
    return ClaimRecord(uid, "ns", uid, state, [dev])


GiB = 1024**3


def test_a_gpu_lent_only_in_shares_counts_its_fraction_not_a_whole_gpu() -> None:
    d = NodeStateData(boot_id="b")
    d.claims = {
        "w": _rec("w", 1, "lendable"),
        "s1": _rec("s1", 0, "share", memory=20 * GiB, compute=10),
        "s2": _rec("s2", 0, "share", memory=40 * GiB, compute=10),  # 60 of 141 GiB: memory decides
        "s3": _rec("s3", 2, "share", memory=GiB, compute=25),  # compute decides
        "s4": _rec("s4", 3, "share", PREPARE_STARTED, memory=GiB, compute=25),  # not prepared yet
        "f": _rec("f", 2, "servingshare", memory=70 * GiB, compute=50),  # serving's: not lent
    }
    d.suspensions = {"s2": Suspension("s2", SUSPENDED, ["x"], "simulated", 0)}  # suspended: still lent
    facts = node_facts(d, 100, gpu_memory={i: 141 * GiB for i in range(4)})
    assert facts[names.ANNOTATION_LENT] == "1"
    assert facts[names.ANNOTATION_LENT_SHARES] == "0=0.43,2=0.25"  # 60/141 = 0.4255 rounded up
    assert lentfacts.parse_shares(facts[names.ANNOTATION_LENT_SHARES]) == {0: 0.43, 2: 0.25}
    assert lentfacts.lent_gpu_equivalents(facts) == pytest.approx(1.68)
    # without the GPUs' memory only compute counts
    assert node_facts(d, 100)[names.ANNOTATION_LENT_SHARES] == "0=0.20,2=0.25"


@pytest.mark.parametrize("raw", ["0", "0=x", "a=0.5", "0=1.5", "0=-0.1"])
def test_a_malformed_shares_annotation_is_one_clear_error(raw: str) -> None:
    with pytest.raises(ValueError, match=f"rose.io/lent-gpu-shares: bad entry '{raw}'"):
        lentfacts.parse_shares(raw)
    assert lentfacts.parse_shares("") == {} and lentfacts.parse_shares(None) == {}


def test_facts_from_state() -> None:
    d = NodeStateData(boot_id="b")
    assert node_facts(d, 100) == {
        names.ANNOTATION_HOST_MEM_FREE: "100",
        names.ANNOTATION_LENT: "",
        names.ANNOTATION_LENT_SHARES: "",
    }
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
    assert node_facts(d, 100) == {
        names.ANNOTATION_HOST_MEM_FREE: "70",
        names.ANNOTATION_LENT: "1,3",
        names.ANNOTATION_LENT_SHARES: "",
    }
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
