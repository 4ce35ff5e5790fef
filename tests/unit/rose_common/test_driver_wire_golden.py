"""Golden bytes of one request and one response of every RPC, written by hand from the proto
wire format (tag = field_number << 3 | wire_type; 0x0a = field 1 length-delimited, 0x12 = field
2, 0x1a = field 3, 0x22 = field 4, 0x2a = field 5, 0x08 = field 1 varint), never by encoding
with the same stubs. Each golden is checked both ways: our encoding equals it, and it decodes
to the expected message."""

from __future__ import annotations

from typing import Any

import pytest

from rose_common.proto import k8s_dra_v1_pb2 as v1
from rose_common.proto import k8s_dra_v1beta1_pb2 as v1beta1
from rose_common.proto import k8s_pluginregistration_pb2 as reg

# Claim{namespace="ns", uid="u1", name="c"}: 0a 02 'ns' 12 02 'u1' 1a 01 'c' = 11 bytes
CLAIM = b"\x0a\x02ns" + b"\x12\x02u1" + b"\x1a\x01c"
CLAIMS_REQUEST = b"\x0a\x0b" + CLAIM  # repeated Claim claims = 1

CDI_ID = b"gpu.rose.io/gpu=u1-gpu-0-serving"  # 32 bytes
DEVICE = (
    b"\x0a\x03gpu"  # request_names = 1
    + b"\x12\x02n0"  # pool_name = 2
    + b"\x1a\x0dgpu-0-serving"  # device_name = 3 (13 bytes)
    + b"\x22\x20"
    + CDI_ID  # cdi_device_ids = 4 (32 bytes)
)  # 5 + 4 + 15 + 34 = 58 = 0x3a bytes
PREPARE_RESPONSE = (
    b"\x0a\x42"  # map entry, field 1, 66 bytes
    + b"\x0a\x02u1"  # key
    + b"\x12\x3c"  # value: NodePrepareResourceResponse, 60 bytes
    + b"\x0a\x3a"
    + DEVICE  # devices = 1
)
PREPARE_ERROR_RESPONSE = b"\x0a\x0c" + b"\x0a\x02u2" + b"\x12\x06" + b"\x12\x04boom"  # {"u2": {error: "boom"}}
UNPREPARE_RESPONSE = b"\x0a\x09" + b"\x0a\x02u1" + b"\x12\x03" + b"\x0a\x01x"  # {"u1": {error: "x"}}
UNPREPARE_OK_RESPONSE = b"\x0a\x06" + b"\x0a\x02u1" + b"\x12\x00"  # {"u1": {}}
PLUGIN_INFO = (
    b"\x0a\x09DRAPlugin"  # type = 1
    + b"\x12\x0bgpu.rose.io"  # name = 2
    + b"\x1a\x0b/p/dra.sock"  # endpoint = 3
    + b"\x22\x0cv1.DRAPlugin"  # supported_versions = 4
    + b"\x22\x11v1beta1.DRAPlugin"
)


def _claims_msg(mod: Any, cls: str) -> Any:
    m = getattr(mod, cls)()
    m.claims.add(namespace="ns", uid="u1", name="c")
    return m


def _prepare_resp(mod: Any) -> Any:
    m = mod.NodePrepareResourcesResponse()
    m.claims["u1"].devices.add(
        request_names=["gpu"], pool_name="n0", device_name="gpu-0-serving", cdi_device_ids=[CDI_ID.decode()]
    )
    return m


@pytest.mark.parametrize("mod", [v1, v1beta1], ids=["v1", "v1beta1"])
@pytest.mark.parametrize("cls", ["NodePrepareResourcesRequest", "NodeUnprepareResourcesRequest"])
def test_claims_requests(mod: Any, cls: str) -> None:
    msg = _claims_msg(mod, cls)
    assert msg.SerializeToString() == CLAIMS_REQUEST
    assert getattr(mod, cls).FromString(CLAIMS_REQUEST) == msg


@pytest.mark.parametrize("mod", [v1, v1beta1], ids=["v1", "v1beta1"])
def test_prepare_response(mod: Any) -> None:
    msg = _prepare_resp(mod)
    assert msg.SerializeToString() == PREPARE_RESPONSE
    assert mod.NodePrepareResourcesResponse.FromString(PREPARE_RESPONSE) == msg
    err = mod.NodePrepareResourcesResponse()
    err.claims["u2"].error = "boom"
    assert err.SerializeToString() == PREPARE_ERROR_RESPONSE


def test_v1_share_id_is_field_5_and_v1beta1_has_none() -> None:
    d = v1.Device(device_name="g", share_id="s")
    assert d.SerializeToString() == b"\x1a\x01g" + b"\x2a\x01s"
    assert v1.Device(device_name="g").SerializeToString() == b"\x1a\x01g"  # optional: absent when unset
    assert "share_id" not in v1beta1.Device.DESCRIPTOR.fields_by_name


@pytest.mark.parametrize("mod", [v1, v1beta1], ids=["v1", "v1beta1"])
def test_unprepare_response(mod: Any) -> None:
    m = mod.NodeUnprepareResourcesResponse()
    m.claims["u1"].error = "x"
    assert m.SerializeToString() == UNPREPARE_RESPONSE
    ok = mod.NodeUnprepareResourcesResponse()
    ok.claims["u1"].SetInParent()
    assert ok.SerializeToString() == UNPREPARE_OK_RESPONSE
    assert mod.NodeUnprepareResourcesResponse.FromString(UNPREPARE_OK_RESPONSE).claims["u1"].error == ""


def test_registration_get_info() -> None:
    assert reg.InfoRequest().SerializeToString() == b""
    info = reg.PluginInfo(
        type="DRAPlugin",
        name="gpu.rose.io",
        endpoint="/p/dra.sock",
        supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    )
    assert info.SerializeToString() == PLUGIN_INFO
    assert reg.PluginInfo.FromString(PLUGIN_INFO) == info


def test_registration_notify_status() -> None:
    assert reg.RegistrationStatus(plugin_registered=True).SerializeToString() == b"\x08\x01"
    bad = b"\x12\x03bad"  # plugin_registered=false (default, omitted), error="bad"
    assert reg.RegistrationStatus(plugin_registered=False, error="bad").SerializeToString() == bad
    assert reg.RegistrationStatusResponse().SerializeToString() == b""


def test_package_and_service_names() -> None:
    assert v1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    assert v1beta1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    assert reg.DESCRIPTOR.package == "pluginregistration"
    assert v1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert [m.name for m in reg.DESCRIPTOR.services_by_name["Registration"].methods] == [
        "GetInfo",
        "NotifyRegistrationStatus",
    ]
