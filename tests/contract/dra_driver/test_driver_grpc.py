"""A kubelet-side client calls the driver over real unix sockets with the real method names.

The client speaks bytes: requests are the hand-written golden encodings (or built with the
kubelet's message layout), replies are decoded with the stubs. Claims come from an in-memory
stand-in for the API server; the suspend engine is the recording stand-in (no GPU here).
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.plugin import PluginServers, start_plugin
from rose_common.proto import k8s_dra_v1_pb2 as v1
from rose_common.proto import k8s_dra_v1beta1_pb2 as v1beta1
from rose_common.proto import k8s_pluginregistration_pb2 as reg
from tests.support.driver_fixtures import NS, RecordingEngine, StaticClaims, make_claim, make_driver
from tests.support.kubelet_grpc import REG, V1, V1BETA1, Kubelet

L0 = make_claim("uid-l0", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-0", "pod-rl-0"))
S0 = make_claim("uid-s0", "s0", [("gpu", "gpu-0-serving")])
S1 = make_claim("uid-s1", "s1", [("gpu", "gpu-1-serving")])
OTHER = make_claim("uid-o", "o", [("gpu", "gpu-0")], driver="gpu.nvidia.com")
UNALLOC = make_claim("uid-u", "u", [("gpu", "gpu-1-lendable")], allocated=False)


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[tuple[Kubelet, RecordingEngine, PluginServers, list[str]]]:
    engine = RecordingEngine()
    driver = make_driver(tmp_path, StaticClaims([L0, S0, S1, OTHER, UNALLOC]), engine)
    driver.recover()
    registered: list[str] = []
    servers = start_plugin(
        driver,
        tmp_path / "plugins" / "gpu.rose.io",
        tmp_path / "registry",
        on_registered=lambda: registered.append("ok"),
        on_failed=lambda e: registered.append("failed: " + e),
    )
    k = Kubelet(servers.dra_socket, servers.registration_socket)
    yield k, engine, servers, registered
    k.close()
    servers.stop()
    driver.close()


def test_registration_get_info_and_notify(plugin) -> None:  # type: ignore[no-untyped-def]
    k, _, servers, registered = plugin
    info = reg.PluginInfo.FromString(k.call(k.reg, REG + "GetInfo", b""))
    assert info.type == "DRAPlugin" and info.name == "gpu.rose.io"
    assert info.endpoint == str(servers.dra_socket)
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert k.call(k.reg, REG + "NotifyRegistrationStatus", b"\x08\x01") == b""
    assert k.call(k.reg, REG + "NotifyRegistrationStatus", b"\x12\x0ebad endpoint x") == b""
    assert registered == ["ok", "failed: bad endpoint x"]
    assert servers.registration_socket.name == "gpu.rose.io-reg.sock"


def test_sockets_are_private(plugin) -> None:  # type: ignore[no-untyped-def]
    _, _, servers, _ = plugin
    for s in (servers.dra_socket, servers.registration_socket):
        st = s.stat()
        assert stat.S_ISSOCK(st.st_mode) and st.st_mode & 0o777 == 0o600
        assert s.parent.stat().st_mode & 0o777 == 0o700


def test_prepare_mixed_batch_per_claim_errors_never_rpc_error(plugin) -> None:  # type: ignore[no-untyped-def]
    k, _, _, _ = plugin
    unknown = make_claim("uid-gone", "gone", [("gpu", "gpu-1-serving")])
    resp = k.prepare([S1, OTHER, UNALLOC, unknown])
    assert set(resp.claims) == {"uid-s1", "uid-o", "uid-u", "uid-gone"}
    ok = resp.claims["uid-s1"]
    assert ok.error == "" and [
        (d.pool_name, d.device_name, list(d.cdi_device_ids), list(d.request_names)) for d in ok.devices
    ] == [("node-a", "gpu-1-serving", ["gpu.rose.io/gpu=uid-s1-gpu-1-serving"], ["gpu"])]
    assert "no devices of driver gpu.rose.io" in resp.claims["uid-o"].error
    assert "not allocated" in resp.claims["uid-u"].error
    assert "not found" in resp.claims["uid-gone"].error
    assert k.prepare([S1]).claims["uid-s1"] == ok  # idempotent over the wire
    un = k.unprepare([S1, unknown])
    assert un.claims["uid-s1"].error == "" and un.claims["uid-gone"].error == ""


def test_golden_request_bytes_reach_the_driver(plugin) -> None:  # type: ignore[no-untyped-def]
    k, _, _, _ = plugin
    # Claim{namespace="ml", uid="uid-s1", name="s1"} written by hand
    claim = b"\x0a\x02ml" + b"\x12\x06uid-s1" + b"\x1a\x02s1"
    raw = k.call(k.dra, V1 + "NodePrepareResources", b"\x0a" + bytes([len(claim)]) + claim)
    resp = v1.NodePrepareResourcesResponse.FromString(raw)
    assert resp.claims["uid-s1"].devices[0].device_name == "gpu-1-serving"
    raw = k.call(k.dra, V1 + "NodeUnprepareResources", b"\x0a" + bytes([len(claim)]) + claim)
    assert raw == b"\x0a\x0a" + b"\x0a\x06uid-s1" + b"\x12\x00"  # {"uid-s1": {}}


def test_v1beta1_serves_the_same(plugin) -> None:  # type: ignore[no-untyped-def]
    k, _, _, _ = plugin
    resp = k.prepare([S1, OTHER], v1beta1, V1BETA1)
    assert resp.claims["uid-s1"].devices[0].cdi_device_ids == ["gpu.rose.io/gpu=uid-s1-gpu-1-serving"]
    assert resp.claims["uid-o"].error
    assert k.unprepare([S1], v1beta1, V1BETA1).claims["uid-s1"].error == ""


def test_malformed_claim_in_request_is_a_per_claim_error(plugin) -> None:  # type: ignore[no-untyped-def]
    k, _, _, _ = plugin
    req = v1.NodePrepareResourcesRequest()
    req.claims.add(namespace="", uid="uid-s1", name="s1")
    resp = v1.NodePrepareResourcesResponse.FromString(
        k.call(k.dra, V1 + "NodePrepareResources", req.SerializeToString())
    )
    assert "lacks namespace" in resp.claims["uid-s1"].error


def test_serving_prepare_suspends_occupant_first_unprepare_resumes(plugin) -> None:  # type: ignore[no-untyped-def]
    k, engine, _, _ = plugin
    assert k.prepare([L0]).claims["uid-l0"].error == ""
    assert engine.calls == []
    resp = k.prepare([S0])
    assert resp.claims["uid-s0"].error == "" and engine.calls == [("suspend", "uid-l0", 30.0)]
    assert k.unprepare([S0]).claims["uid-s0"].error == ""
    assert [c[:2] for c in engine.calls] == [("suspend", "uid-l0"), ("resume", "uid-l0")]
    assert NS == "ml"


def test_serving_wins_through_the_suspend_engine_simulated_backend(tmp_path: Path) -> None:
    """The same flow with the real suspend engine (dra_driver.suspend) and its explicit simulated backend."""
    from dra_driver import cli, discovery
    from dra_driver.metrics import DriverMetrics

    args = cli.build_parser().parse_args(
        [
            "--node-name",
            "node-a",
            "--gpu-backend",
            "simulated",
            "--suspend-backends",
            "simulated",
            "--simulated-occupant-bytes",
            "256Mi",
            "--host-memory-budget",
            "1Gi",
        ]
    )
    gpus = discovery.discover("simulated", "node-a", discovery.SimulatedConfig(count=2))
    metrics = DriverMetrics([0, 1])
    evicted: list[str] = []

    class Evictor:
        def evict(self, reg: Any, reason: str) -> None:
            evicted.append(reason)

    engine = cli.build_engine(args, gpus, None, Evictor(), metrics.registry)
    driver = make_driver(tmp_path, StaticClaims([L0, S0]), engine, metrics=metrics)
    driver.recover()
    servers = start_plugin(driver, tmp_path / "p", tmp_path / "r")
    k = Kubelet(servers.dra_socket, servers.registration_socket)
    try:
        assert k.prepare([L0]).claims["uid-l0"].error == ""
        assert k.prepare([S0]).claims["uid-s0"].error == ""
        assert engine.occupant_state("uid-l0") == "suspended"
        s = driver.snapshot().suspensions["uid-l0"]
        assert (s.backend, s.bytes_moved) == ("simulated", 256 * 2**20)
        assert k.unprepare([S0]).claims["uid-s0"].error == ""
        assert engine.occupant_state("uid-l0") == "running" and evicted == []
    finally:
        k.close()
        servers.stop()
        driver.close()
