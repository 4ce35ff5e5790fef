"""`rose demo` act 4's serving fraction without a cluster: the claim template the act makes from
``examples/serving-share-claim-template.yaml`` asks for its fraction on the shares' GPU, and with the
act's figures the driver's own pure decision (``dra_driver.shares.reclaim_for_serving``) suspends
exactly one of the two 0.5 GPU shares; and the one-line view of the shares' states."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dra_driver.claims import PreparedDevice
from dra_driver.shares import reclaim_for_serving
from rose_cli import demo_elastic
from rose_common import names
from rose_common.quantity import to_int

GPU_MEMORY = 141 * 2**30  # the simulated GPU of `rose demo`'s drivers
EXAMPLES = Path(demo_elastic.TRAINER).parent


def _example() -> dict[str, object]:
    got: dict[str, object] = yaml.safe_load((EXAMPLES / "serving-share-claim-template.yaml").read_text())
    return got


def _device(role: str, memory: str | int, compute: str | int) -> PreparedDevice:
    dev = f"gpu-3-{role}"
    return PreparedDevice(("gpu",), "n", dev, (), 3, "uuid", role, to_int(str(memory)), int(compute))


def test_the_serving_fraction_template_asks_for_the_fraction_on_the_shares_gpu() -> None:
    example = _example()
    body = demo_elastic.serving_fraction_template(example, "serve-frac", 3)
    assert body["metadata"] == {"name": "serve-frac"}
    subs = body["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert [s["name"] for s in subs] == ["beside-shares", "over-whole"]
    for sub in subs:
        assert sub["deviceClassName"] == names.DEVICE_CLASS_SERVING_SHARE
        assert sub["capacity"] == {"requests": {"memory": "40Gi", "compute": "40"}}
        assert sub["selectors"] == [{"cel": {"expression": 'device.attributes["gpu.rose.io"].index == 3'}}]
    assert example == _example(), "the example itself is untouched"


@pytest.mark.parametrize(
    ("memory", "compute", "suspended"),
    [
        (
            demo_elastic.SERVING_FRACTION["memory"],
            demo_elastic.SERVING_FRACTION["compute"],
            ["a"],
        ),  # the act's: one (equal: by uid)
        ("20Gi", "0", []),  # fits beside both shares: nothing suspended
        ("100Gi", "40", ["a", "b"]),  # 100 GiB leaves room for neither 60 GiB share
    ],
)
def test_the_acts_serving_fraction_suspends_one_of_the_two_shares(
    memory: str, compute: str, suspended: list[str]
) -> None:
    share = _device(names.ROLE_SHARE, demo_elastic.SHARE["memory"], demo_elastic.SHARE["compute"])
    serving = [_device(names.ROLE_SERVING_SHARE, memory, compute)]
    assert reclaim_for_serving(GPU_MEMORY, serving, [("a", share), ("b", share)]) == suspended


def test_share_states_line() -> None:
    line = demo_elastic.share_states_line({"w-1": "Suspended", "w-0": "Running"})
    assert line == "suspended: w-1; running: w-0"
    assert demo_elastic.share_states_line({"w-1": "Running", "w-0": "Running"}) == "running: w-0, w-1"
    assert demo_elastic.share_states_line({}) == ""
