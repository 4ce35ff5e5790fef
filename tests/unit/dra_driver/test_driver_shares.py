"""GPU shares (issue 27 §3): the shareable device's shape, the prepare-time accounting, the CUDA
MPS settings in the claim's CDI spec, and serving reclaiming the shares of its GPU first.

The node-level tests use the unit tier's explicit stand-ins (claims in memory, a recording suspend
engine); tests/e2e/dra_driver/test_driver_shares_e2e.py runs the same against the real API server and
scheduler."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver import cdi, shares
from dra_driver.claims import ClaimError, ClaimRef, PreparedDevice, validate_claim
from dra_driver.node import lent_held
from rose_common import names
from rose_common.slices import (
    GpuInfo,
    parse_device_name,
    resource_slice,
    share_device,
    taint_lent_held,
    taint_serving_held,
)
from tests.support.driver_fixtures import NS, RecordingEngine, RecordingNotifier, StaticClaims, make_claim, make_driver

GiB = 1024**3
GPU = GpuInfo(index=0, uuid="GPU-a", model="H200", memory_bytes=141 * GiB + 12345)


def share_claim(uid: str, memory: str, compute: str, device: str = "gpu-0-share") -> dict[str, Any]:
    c: dict[str, Any] = make_claim(uid, uid, [("gpu", device)], pod=(f"p-{uid}", f"pod-{uid}"))
    res = c["status"]["allocation"]["devices"]["results"][0]
    res["consumedCapacity"] = {"memory": memory, "compute": compute}
    res["shareID"] = f"share-{uid}"
    return c


def dev(role: str, gpu: int = 0, memory: int = 0, compute: int = 0) -> PreparedDevice:
    d = f"gpu-{gpu}-{role}"
    return PreparedDevice(("gpu",), "n", d, (f"gpu.rose.io/gpu=u-{d}",), gpu, f"GPU-{gpu}", role, memory, compute)


def ref(c: dict[str, Any]) -> ClaimRef:
    return ClaimRef(NS, c["metadata"]["uid"], c["metadata"]["name"])


# ------------------------------------------------------------------------------ the slice
def test_share_device_is_multi_allocatable_with_stepped_capacities() -> None:
    d = share_device(GPU)
    assert d["name"] == "gpu-0-share" and d["allowMultipleAllocations"] is True
    assert d["attributes"][names.ATTR_ROLE] == {"string": "share"}
    assert d["attributes"][names.ATTR_PHYSICAL_GPU] == {"string": "GPU-a"}
    mem = d["capacity"]["memory"]
    assert mem["value"] == str(141 * GiB)  # whole steps only
    assert mem["requestPolicy"]["validRange"] == {"min": str(GiB), "step": str(GiB)}
    assert d["capacity"]["compute"]["value"] == "100"
    assert parse_device_name("gpu-0-share") == (0, "share")


def test_shares_only_behind_the_flag_and_a_full_slice_is_refused() -> None:
    plain = resource_slice("n", [GPU], 1)["spec"]["devices"]
    assert [d["name"] for d in plain] == ["gpu-0-serving", "gpu-0-lendable"]
    shared = resource_slice("n", [GPU], 1, shares=True)["spec"]["devices"]
    assert [d["name"] for d in shared] == ["gpu-0-serving", "gpu-0-lendable", "gpu-0-share", "gpu-0-servingshare"]
    many = [GpuInfo(i, f"G{i}", "m", 80 * GiB) for i in range(33)]
    with pytest.raises(ValueError, match="at most 32 fit one ResourceSlice"):
        resource_slice("n", many, 1, shares=True)
    with pytest.raises(ValueError, match="at least 2 GiB"):
        share_device(GpuInfo(0, "G", "m", GiB))


def test_serving_holds_taints_the_share_like_the_lendable_device() -> None:
    devs = taint_serving_held(resource_slice("n", [GPU], 1, shares=True)["spec"]["devices"], frozenset({0}))
    tainted = {d["name"] for d in devs if d.get("taints")}
    assert tainted == {"gpu-0-lendable", "gpu-0-share"}


def test_a_gpu_lent_in_shares_or_whole_is_tainted_against_the_other_kind() -> None:
    gpus = [GPU, GpuInfo(1, "GPU-b", "H200", 80 * GiB)]
    devs = resource_slice("n", gpus, 1, shares=True)["spec"]["devices"]
    out = taint_lent_held(devs, shared=frozenset({0}), whole=frozenset({1}))
    taints = {d["name"]: [(t["key"], t["value"]) for t in d["taints"]] for d in out if d.get("taints")}
    assert taints == {
        "gpu-0-lendable": [(names.TAINT_SHARES_HOLD, "0")],
        "gpu-1-share": [(names.TAINT_LENT_WHOLE, "1")],
        "gpu-1-servingshare": [(names.TAINT_LENT_WHOLE, "1")],  # a serving fraction prefers other GPUs
    }
    # idempotent, keeps other taints, and goes when the holds go
    both = taint_serving_held(out, frozenset({0}))
    again = taint_lent_held(both, frozenset({0}), frozenset({1}))
    assert [t["key"] for t in {d["name"]: d for d in again}["gpu-0-lendable"]["taints"]] == [
        names.TAINT_SERVING_HOLDS,
        names.TAINT_SHARES_HOLD,
    ]
    assert not any(d.get("taints") for d in taint_lent_held(out, frozenset(), frozenset()))


# ------------------------------------------------------------------------------ claims
def test_a_share_claims_consumed_capacity_becomes_its_limits() -> None:
    c = share_claim("u1", "20Gi", "25")
    v = validate_claim(c, ref(c), names.DRIVER_NAME, "node-a", {0: "GPU-a"})
    d = v.devices[0]
    assert (d.role, d.memory_bytes, d.compute_percent) == ("share", 20 * GiB, 25)
    assert PreparedDevice.from_json(d.to_json()) == d  # survives the checkpoint
    two = share_claim("u3", "20Gi", "25")
    second = dict(two["status"]["allocation"]["devices"]["results"][0], request="gpu2", shareID="s2")
    second["consumedCapacity"] = {"memory": "10Gi", "compute": "5"}
    two["status"]["allocation"]["devices"]["results"].append(second)
    (both,) = validate_claim(two, ref(two), names.DRIVER_NAME, "node-a", {0: "GPU-a"}).devices
    assert (both.memory_bytes, both.compute_percent, both.request_names) == (30 * GiB, 30, ("gpu", "gpu2"))
    bad = make_claim("u2", "u2", [("gpu", "gpu-0-share")])
    with pytest.raises(ClaimError, match="no valid consumedCapacity"):
        validate_claim(bad, ref(bad), names.DRIVER_NAME, "node-a", {0: "GPU-a"})


# ------------------------------------------------------------------------------ accounting (pure)
def test_share_conflict_rules() -> None:
    s20 = dev("share", memory=20 * GiB, compute=25)
    assert shares.share_conflict(s20, [("ns/a", dev("share", memory=100 * GiB, compute=50))], 141 * GiB) is None
    over_mem = shares.share_conflict(s20, [("ns/a", dev("share", memory=130 * GiB, compute=5))], 141 * GiB)
    assert over_mem is not None and "over its memory" in over_mem
    over_cpu = shares.share_conflict(s20, [("ns/a", dev("share", memory=GiB, compute=80))], 141 * GiB)
    assert over_cpu is not None and "over 100 %" in over_cpu
    beside = shares.share_conflict(s20, [("ns/l", dev("lendable"))], 141 * GiB)
    assert beside is not None and "lent whole to claim ns/l" in beside
    whole = shares.share_conflict(dev("lendable"), [("ns/a", s20)], 141 * GiB)
    assert whole is not None and "shared by share claims ns/a" in whole
    # another GPU's claims do not count; serving is the node's own rule
    assert shares.share_conflict(s20, [("ns/l", dev("lendable", gpu=1))], 141 * GiB) is None
    assert shares.share_conflict(dev("serving"), [("ns/a", s20)], 141 * GiB) is None


def test_over_limit_names_the_shares_holding_more_than_their_memory() -> None:
    assert shares.over_limit({"a": 5, "b": 30}, {"a": 10, "b": 20, "c": 1}) == {"b": (30, 20)}


# ------------------------------------------------------------------------------ CDI
def test_cdi_spec_of_a_share_carries_the_mps_settings() -> None:
    d = dev("share", memory=20 * GiB + 5, compute=25)
    root = Path("/var/lib/kubelet/plugins/gpu.rose.io/mps")  # <state-dir>/mps: dra_driver.mps
    spec = cdi.build_spec("u1", [d], {0: 0}, simulated=False, extra_env=shares.mps_env([d]), mps_root=root)
    env = spec["containerEdits"]["env"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in env  # MiB, rounded down
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env
    assert "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia/mps/pipe" in env
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert mounts["/run/nvidia/mps/pipe"] == f"{root}/gpu-0/pipe"
    assert mounts["/run/nvidia/mps/log"] == f"{root}/gpu-0/log"
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0"}]
    whole = cdi.build_spec(
        "u2", [dev("lendable")], {0: 0}, simulated=False, extra_env=shares.mps_env([dev("lendable")])
    )
    assert "MPS" not in json.dumps(whole)


# ------------------------------------------------------------------------------ the node
@pytest.fixture
def node(tmp_path: Path):  # type: ignore[no-untyped-def]
    claims = StaticClaims(
        [
            share_claim("a", "60Gi", "25"),
            share_claim("b", "60Gi", "25"),
            share_claim("c", "60Gi", "25"),  # the scheduler would not allocate it: the driver refuses too
            make_claim("l0", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-l", "pod-l")),
            make_claim("s0", "s0", [("gpu", "gpu-0-serving")], pod=("serve", "pod-s")),
        ]
    )
    engine, notifier = RecordingEngine(), RecordingNotifier()
    d = make_driver(tmp_path, claims, engine, notifier)  # simulated GPUs of 141 GiB
    d.recover()
    yield d, engine, tmp_path
    d.close()


def test_shares_prepare_side_by_side_within_the_gpu_and_serving_reclaims_them(node) -> None:  # type: ignore[no-untyped-def]
    d, engine, tmp = node
    out = d.prepare([ClaimRef(NS, "a", "a"), ClaimRef(NS, "b", "b")])
    assert out["a"].error == "" and out["b"].error == ""
    spec = json.loads((tmp / "cdi" / cdi.spec_filename("a")).read_text())
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=61440M" in spec["containerEdits"]["env"]
    assert "mounts" not in json.dumps(spec["devices"])  # simulated: no MPS daemon directories
    assert d.metrics.share_claims.labels("0")._value.get() == 2
    assert d.metrics.share_memory_bytes.labels("0")._value.get() == 120 * GiB
    assert "over its memory" in d.prepare([ClaimRef(NS, "c", "c")])["c"].error
    assert "shared by share claims" in d.prepare([ClaimRef(NS, "l0", "l0")])["l0"].error
    assert d.metrics.share_refused_total._value.get() == 2
    assert lent_held(d.snapshot()) == (frozenset({0}), frozenset(), frozenset())  # what the publisher taints
    # serving's growth onto GPU 0: both shares are suspended before serving is prepared
    assert d.prepare([ClaimRef(NS, "s0", "s0")])["s0"].error == ""
    assert sorted(c[1] for c in engine.calls if c[0] == "suspend") == ["a", "b"]
    assert {u: s.held_by for u, s in d.snapshot().suspensions.items()} == {"a": ["s0"], "b": ["s0"]}
    assert d.unprepare([ClaimRef(NS, "s0", "s0")]) == {"s0": ""}
    assert sorted(c[1] for c in engine.calls if c[0] == "resume") == ["a", "b"]


def test_a_share_over_its_memory_limit_is_reported_once_per_crossing(tmp_path: Path) -> None:
    """The simulated backend's accounting: the repair loop checks the claim's device-memory file
    against the memory its allocation consumed (1 MiB here)."""
    from dra_driver.enforce import Enforcer
    from dra_driver.suspend.devicewatch import SimulatedDeviceMemory

    notifier = RecordingNotifier()
    claims = StaticClaims([share_claim("a", "1Mi", "25")])
    watch = SimulatedDeviceMemory(tmp_path / "claims")
    d = make_driver(tmp_path, claims, RecordingEngine(), notifier, enforcer=Enforcer(watch))
    d.recover()
    try:
        assert d.prepare([ClaimRef(NS, "a", "a")])["a"].error == ""
        memory = watch.path("a")
        memory.parent.mkdir(parents=True)
        memory.write_bytes(b"\1" * 2**20)  # at the limit: fine
        d.reconcile()
        assert d.metrics.shares_over_limit._value.get() == 0
        memory.write_bytes(b"\1" * (2 * 2**20))  # over it
        d.reconcile()
        d.reconcile()
        over = [e for e in notifier.events if e[1] == "ShareOverLimit"]
        assert over == [("p-a", "ShareOverLimit", True)]  # a warning, once, not on every pass
        assert d.metrics.share_over_limit_total._value.get() == 1
        assert d.metrics.shares_over_limit._value.get() == 1
        memory.write_bytes(b"")
        d.reconcile()
        assert d.metrics.shares_over_limit._value.get() == 0
    finally:
        d.close()


def test_a_restarted_driver_keeps_the_shares_limits(tmp_path: Path) -> None:
    """The limits live in the checkpoint: after a restart the accounting still refuses the third
    share and the gauges show the recorded shares."""
    claims = StaticClaims([share_claim("a", "100Gi", "50"), share_claim("b", "60Gi", "25")])
    d = make_driver(tmp_path, claims, RecordingEngine())
    d.recover()
    assert d.prepare([ClaimRef(NS, "a", "a")])["a"].error == ""
    d.close()
    again = make_driver(tmp_path, claims, RecordingEngine())
    again.recover()
    try:
        assert again.snapshot().claims["a"].devices[0].memory_bytes == 100 * GiB
        assert "over its memory" in again.prepare([ClaimRef(NS, "b", "b")])["b"].error
        assert again.metrics.share_memory_bytes.labels("0")._value.get() == 100 * GiB
    finally:
        again.close()


class MeetingEngine(RecordingEngine):
    """A suspend engine whose suspends return only once ``parties`` of them are in flight together
    (a barrier): a driver that reclaimed the shares of a GPU one after another would break it."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        import threading

        self.barrier = threading.Barrier(parties, timeout=10)
        self.met = 0

    def suspend(self, claim_uid: str, grace_seconds: float) -> Any:
        self.barrier.wait()  # BrokenBarrierError (a failed suspend) unless all are in flight at once
        self.met += 1
        return super().suspend(claim_uid, grace_seconds)


def test_serving_reclaims_the_shares_of_its_gpu_together_not_one_after_another(tmp_path: Path) -> None:
    claims = StaticClaims(
        [
            share_claim("a", "40Gi", "25"),
            share_claim("b", "40Gi", "25"),
            share_claim("c", "40Gi", "25"),
            make_claim("s0", "s0", [("gpu", "gpu-0-serving")], pod=("serve", "pod-s")),
        ]
    )
    engine = MeetingEngine(3)
    d = make_driver(tmp_path, claims, engine, RecordingNotifier())
    d.recover()
    try:
        out = d.prepare([ClaimRef(NS, u, u) for u in "abc"])
        assert all(o.error == "" for o in out.values()), out
        assert d.prepare([ClaimRef(NS, "s0", "s0")])["s0"].error == ""
        assert engine.met == 3  # all three were in flight at once
        assert {u: s.state for u, s in d.snapshot().suspensions.items()} == dict.fromkeys("abc", "Suspended")
    finally:
        d.close()
