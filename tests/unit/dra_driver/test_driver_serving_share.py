"""Serving's fraction of a GPU beside RL shares (issue 27 §3): the device ``gpu-N-servingshare``,
the pure choice of which lent claims a serving fraction reclaims (``shares.reclaim_for_serving``), the
prepare-time rules, and the node driver preparing a serving fraction beside an RL share, then
suspending only the share that no longer fits when serving grows (the unit tier's explicit
stand-ins: claims in memory, a recording suspend engine; the e2e tier runs it against the real API
server and scheduler: tests/e2e/dra_driver/test_driver_serving_share_e2e.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_driver import shares
from dra_driver.claims import ClaimRef, PreparedDevice
from dra_driver.node import lent_held, running_lent
from rose_common import names
from rose_common.slices import (
    GpuInfo,
    gpu_devices,
    parse_device_name,
    share_device,
    taint_lent_held,
    taint_serving_held,
)
from tests.support.driver_fixtures import NS, RecordingEngine, RecordingNotifier, StaticClaims, make_claim, make_driver

GiB = 1024**3
GPU_MEM = 141 * GiB


def dev(role: str, gpu: int = 0, memory: int = 0, compute: int = 0) -> PreparedDevice:
    d = f"gpu-{gpu}-{role}"
    return PreparedDevice(("gpu",), "n", d, (f"gpu.rose.io/gpu=u-{d}",), gpu, f"GPU-{gpu}", role, memory, compute)


def share_claim(uid: str, memory: str, compute: str, device: str, pod: str) -> dict[str, Any]:
    c: dict[str, Any] = make_claim(uid, uid, [("gpu", device)], pod=(pod, f"pod-{uid}"))
    res = c["status"]["allocation"]["devices"]["results"][0]
    res["consumedCapacity"] = {"memory": memory, "compute": compute}
    res["shareID"] = f"share-{uid}"
    return c


def test_serving_share_device_is_published_beside_the_rl_share_device() -> None:
    gpus = [GpuInfo(i, f"GPU-{i}", "H200", GPU_MEM) for i in (0, 1)]
    devs = {d["name"]: d for d in gpu_devices(gpus, shares=True)}
    srv = devs["gpu-1-servingshare"]
    assert srv["allowMultipleAllocations"] is True
    assert srv["attributes"][names.ATTR_ROLE] == {"string": names.ROLE_SERVING_SHARE}
    assert srv["capacity"] == devs["gpu-1-share"]["capacity"]
    assert parse_device_name("gpu-1-servingshare") == (1, names.ROLE_SERVING_SHARE)
    assert "gpu-0-servingshare" not in {d["name"] for d in gpu_devices(gpus)}  # only with --gpu-shares
    with pytest.raises(ValueError, match="shareable device's role"):
        share_device(gpus[0], names.ROLE_LENDABLE)
    # a GPU lent whole: its serving fraction device is tainted, so a serving fraction asks elsewhere first
    tainted = {d["name"]: d.get("taints") for d in taint_lent_held(list(devs.values()), frozenset(), frozenset({1}))}
    assert tainted["gpu-1-servingshare"] == [{"key": names.TAINT_LENT_WHOLE, "value": "1", "effect": "NoSchedule"}]
    assert tainted["gpu-0-servingshare"] is None and tainted["gpu-1-serving"] is None
    # serving's fractions on GPU 0: its whole serving device is tainted (the driver would refuse it there)
    tainted = {
        d["name"]: d.get("taints")
        for d in taint_lent_held(list(devs.values()), frozenset(), frozenset(), frozenset({0}))
    }
    assert tainted["gpu-0-serving"] == [{"key": names.TAINT_SERVING_FRACTIONS, "value": "0", "effect": "NoSchedule"}]
    assert tainted["gpu-0-servingshare"] is None and tainted["gpu-1-serving"] is None
    # serving's whole-GPU hold taints lent devices only, never serving's fraction device
    held = {d["name"]: d.get("taints") for d in taint_serving_held(list(devs.values()), frozenset({1}))}
    assert held["gpu-1-servingshare"] is None and held["gpu-1-serving"] is None


@pytest.mark.parametrize(
    ("serving", "lent", "want"),
    [
        # both fit: nothing reclaimed
        ([(60, 40)], [("s1", "share", 60, 40)], []),
        # serving grows to 100 GiB / 70 %: the 60 GiB share no longer fits
        ([(60, 40), (40, 30)], [("s1", "share", 60, 40)], ["s1"]),
        # the largest share goes first, and only as many as needed
        ([(60, 40), (40, 30)], [("a", "share", 20, 10), ("b", "share", 30, 10), ("c", "share", 10, 5)], ["b"]),
        # compute alone can be what does not fit
        ([(10, 80)], [("a", "share", 10, 10), ("b", "share", 10, 15)], ["b"]),
        # a whole-GPU lent claim on the GPU is always reclaimed
        ([(10, 10)], [("w", "lendable", 0, 0)], ["w"]),
    ],
)
def test_reclaim_for_serving_takes_only_what_does_not_fit(
    serving: list[tuple[int, int]], lent: list[tuple[str, str, int, int]], want: list[str]
) -> None:
    srv = [dev(names.ROLE_SERVING_SHARE, memory=m * GiB, compute=c) for m, c in serving]
    pairs = [(uid, dev(role, memory=m * GiB, compute=c)) for uid, role, m, c in lent]
    assert shares.reclaim_for_serving(GPU_MEM, srv, pairs) == want


def test_prepare_rules_for_serving_fractions() -> None:
    frac = dev(names.ROLE_SERVING_SHARE, memory=60 * GiB, compute=40)
    rl = dev(names.ROLE_SHARE, memory=60 * GiB, compute=40)
    # an RL share fits only into what serving's fractions leave free
    assert shares.share_conflict(rl, [("ns/srv", frac)], GPU_MEM) is None
    big = dev(names.ROLE_SHARE, memory=90 * GiB, compute=10)
    why = shares.share_conflict(big, [("ns/srv", frac)], GPU_MEM)
    assert why is not None and "over its memory" in why
    # a serving fraction is never refused for RL shares (it reclaims them) ...
    assert shares.share_conflict(frac, [("ns/rl", big), ("ns/rl2", big)], GPU_MEM) is None
    # ... but serving's fractions stay within the GPU, and never beside serving's whole device
    why = shares.share_conflict(frac, [("ns/a", frac), ("ns/b", frac)], GPU_MEM)
    assert why is not None and "serving fractions" in why
    why = shares.share_conflict(frac, [("ns/whole", dev(names.ROLE_SERVING))], GPU_MEM)
    assert why is not None and "held by serving claim ns/whole" in why
    why = shares.share_conflict(dev(names.ROLE_SERVING), [("ns/f", frac)], GPU_MEM)
    assert why is not None and "held by serving claim ns/f" in why
    # a whole-GPU lent claim never lands beside a serving fraction
    why = shares.share_conflict(dev(names.ROLE_LENDABLE), [("ns/f", frac)], GPU_MEM)
    assert why is not None and "shared by share claims ns/f" in why
    assert shares.mps_env([frac])[names.ENV_MPS_THREAD_PERCENTAGE] == "40"  # serving keeps to its fraction


def test_serving_growth_reclaims_the_share_that_no_longer_fits(tmp_path: Path) -> None:
    claims = StaticClaims(
        [
            share_claim("srv-a", "60Gi", "40", "gpu-0-servingshare", "serve-a"),
            share_claim("rl-s", "60Gi", "40", "gpu-0-share", "rl-s"),
            share_claim("srv-b", "40Gi", "30", "gpu-0-servingshare", "serve-b"),
            make_claim("rl-w", "rl-w", [("gpu", "gpu-1-lendable")], pod=("rl-w", "pod-rl-w")),
        ]
    )
    engine = RecordingEngine()
    d = make_driver(tmp_path, claims, engine, RecordingNotifier())  # simulated GPUs of 141 GiB
    d.recover()
    try:
        out = d.prepare([ClaimRef(NS, u, u) for u in ("srv-a", "rl-s", "rl-w")])
        assert all(o.error == "" for o in out.values()), out
        assert [c for c in engine.calls if c[0] == "suspend"] == []  # serving and the share both fit
        assert lent_held(d.snapshot()) == (frozenset({0}), frozenset({1}), frozenset({0}))
        assert running_lent(d.snapshot(), 0, GPU_MEM) == pytest.approx(60 / 141)  # the share's memory
        assert d.metrics.lent._lent.count == pytest.approx(1 + 60 / 141)  # rose_driver_lent_gpus
        assert d.prepare([ClaimRef(NS, "srv-b", "srv-b")])["srv-b"].error == ""
        assert [c[1] for c in engine.calls if c[0] == "suspend"] == ["rl-s"]  # not the whole GPU 1
        snap = d.snapshot()
        assert running_lent(snap, 0, GPU_MEM) == 0.0 and running_lent(snap, 1, GPU_MEM) == 1.0
        assert d.metrics.lent._lent.count == 1.0
        assert {u: s.held_by for u, s in d.snapshot().suspensions.items()} == {"rl-s": ["srv-b"]}
        assert d.unprepare([ClaimRef(NS, "srv-b", "srv-b")]) == {"srv-b": ""}
        assert [c[1] for c in engine.calls if c[0] == "resume"] == ["rl-s"]
    finally:
        d.close()
