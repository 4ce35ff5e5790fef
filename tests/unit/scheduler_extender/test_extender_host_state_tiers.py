"""The extender's host-memory filter counts both tiers of suspended state the driver publishes:
``rose.io/host-memory-free-bytes`` (DRAM) + ``rose.io/host-state-disk-free-bytes`` (its disk tier)."""

from __future__ import annotations

from rose_common import names
from scheduler_extender import policy
from scheduler_extender.model import PodInfo, PodKind
from tests.support.extender_fixtures import cluster_cache, node

CFG = policy.PolicyConfig()
WINDOWS = {"a": policy.PoolOutlook(1e9, 12, 11.0, ((3600, 11.0),))}
GB = 10**9


def test_host_state_free_sums_the_tiers() -> None:
    assert policy.host_state_free("5", "7") == 12
    assert policy.host_state_free("5", None) == 5  # no disk tier
    assert policy.host_state_free("5", "junk") == 5  # a malformed disk value adds nothing
    assert policy.host_state_free(None, "7") is None  # DRAM not published: not judged
    assert policy.host_state_free("-1", "7") is None
    assert policy.host_state_free("x", None) is None


def test_filter_passes_a_node_whose_disk_tier_makes_up_for_full_dram() -> None:
    cache = cluster_cache({"a": ["dram-only", "both-tiers", "too-small"]}, host_mem_free=None)
    for name, dram, disk in (("dram-only", 2 * GB, None), ("both-tiers", 2 * GB, 6 * GB), ("too-small", 1, 1)):
        obj = node(name, "a", dram)
        if disk is not None:
            obj["metadata"]["annotations"][names.ANNOTATION_SPILL_FREE] = str(disk)
        cache.apply("Node", "MODIFIED", obj)
    snap = cache.snapshot()
    assert snap.host_mem == {"dram-only": 2 * GB, "both-tiers": 8 * GB, "too-small": 2}
    pod = PodInfo("ns", "w", "u-w", PodKind.RL, job="j", gpus=1, state_bytes=5 * GB)
    out = policy.filter_nodes(pod, ["dram-only", "both-tiers", "too-small"], snap, WINDOWS, CFG)
    assert out.passed == ["both-tiers"]
    assert out.unresolvable["dram-only"] == (
        f"host memory for suspended state: {2 * GB} bytes free (DRAM + disk tiers), pod needs {5 * GB}"
    )
    assert "too-small" in out.unresolvable
