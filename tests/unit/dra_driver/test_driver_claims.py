from __future__ import annotations

import pytest

from dra_driver.claims import ClaimError, ClaimRef, validate_claim
from rose_common import names
from tests.support.driver_fixtures import NODE, NS, make_claim

GPUS = {0: "GPU-a", 1: "GPU-b"}


def _v(claim: dict, uid: str = "u1", name: str = "c1"):  # type: ignore[no-untyped-def]
    return validate_claim(claim, ClaimRef(NS, uid, name), names.DRIVER_NAME, NODE, GPUS)


def test_valid_claim_yields_devices_with_cdi_ids_and_pods() -> None:
    c = make_claim("u1", "c1", [("gpu", "gpu-1-lendable"), ("x/sub", "gpu-0-serving")], pod=("p", "pu"))
    v = _v(c)
    assert [(d.device, d.role, d.gpu_index, d.gpu_uuid) for d in v.devices] == [
        ("gpu-1-lendable", "lendable", 1, "GPU-b"),
        ("gpu-0-serving", "serving", 0, "GPU-a"),
    ]
    assert v.devices[0].cdi_ids == ("gpu.rose.io/gpu=u1-gpu-1-lendable",)
    assert v.devices[1].request_names == ("x",)  # base request name, subrequest stripped
    assert [(p.name, p.uid) for p in v.pods] == [("p", "pu")]


@pytest.mark.parametrize(
    ("claim", "uid", "fragment"),
    [
        (make_claim("other", "c1", [("gpu", "gpu-0-serving")]), "u1", "got replaced"),
        (make_claim("u1", "c1", [("gpu", "gpu-0-serving")], allocated=False), "u1", "not allocated"),
        (make_claim("u1", "c1", [("gpu", "gpu-0")], driver="gpu.nvidia.com"), "u1", "no devices of driver"),
        (make_claim("u1", "c1", [("gpu", "gpu-0-serving")], pool="node-b"), "u1", "another node"),
        (make_claim("u1", "c1", [("gpu", "gpu-7-serving")]), "u1", "stale"),
        (make_claim("u1", "c1", [("gpu", "nvidia-0")]), "u1", "not a ROSE GPU device name"),
    ],
)
def test_bad_claims_get_clear_errors(claim: dict, uid: str, fragment: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ClaimError, match=fragment):
        _v(claim, uid=uid)


def test_other_drivers_results_are_ignored() -> None:
    c = make_claim("u1", "c1", [("gpu", "gpu-0-serving")])
    c["status"]["allocation"]["devices"]["results"].append(
        {"request": "nic", "driver": "net.example.com", "pool": "x", "device": "eth0"}
    )
    assert [d.device for d in _v(c).devices] == ["gpu-0-serving"]
