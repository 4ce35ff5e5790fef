"""Pure parts of the local cluster harness and the shared slice shape."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from local_cluster import BinariesError, binaries, port_in_use, reserved_port
from local_cluster.cluster import ClusterHandle, scheduler_config
from local_cluster.pki import generate
from rose_common import names, slices


def test_seed_slice_publishes_each_gpu_as_serving_and_lendable() -> None:
    gpus = slices.simulated_gpus("n1", 3)
    body = slices.resource_slice("n1", gpus, generation=7)
    spec = body["spec"]
    assert spec["driver"] == names.DRIVER_NAME and spec["nodeName"] == "n1"
    assert spec["pool"] == {"name": "n1", "generation": 7, "resourceSliceCount": 1}
    devs = spec["devices"]
    assert [d["name"] for d in devs] == [
        "gpu-0-serving",
        "gpu-1-serving",
        "gpu-2-serving",
        "gpu-0-lendable",
        "gpu-1-lendable",
        "gpu-2-lendable",
    ]
    for d in devs:
        idx, role = slices.parse_device_name(d["name"])
        assert d["attributes"]["role"]["string"] == role
        assert d["attributes"]["physicalGPU"]["string"] == gpus[idx].uuid
        assert len(d["attributes"]) + len(d["capacity"]) <= 32


def test_simulated_gpus_are_deterministic_and_distinct() -> None:
    a, b = slices.simulated_gpus("n1", 4), slices.simulated_gpus("n1", 4)
    assert a == b
    assert len({g.uuid for g in a + slices.simulated_gpus("n2", 4)}) == 8


@pytest.mark.parametrize("bad", ["gpu-x-serving", "gpu-1-other", "cpu-1-serving", "gpu-1"])
def test_parse_device_name_rejects_foreign_names(bad: str) -> None:
    with pytest.raises(ValueError, match="not a ROSE GPU device name"):
        slices.parse_device_name(bad)


def test_too_many_gpus_for_one_slice_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 64"):
        slices.resource_slice("n", slices.simulated_gpus("n", 65), 1)


def test_scheduler_config_carries_the_extender_only_for_rose_scheduler(tmp_path: Path) -> None:
    plain = scheduler_config(tmp_path / "kc", "default-scheduler", None)
    assert "extenders" not in plain
    rose = scheduler_config(tmp_path / "kc", names.SCHEDULER_NAME, "http://127.0.0.1:1234")
    (profile,) = rose["profiles"]
    assert profile["schedulerName"] == "rose-scheduler"
    # serving pods wait for their devices' binding conditions at most this long (issue 27 §1)
    assert profile["pluginConfig"] == [{"name": "DynamicResources", "args": {"bindingTimeout": "120s"}}]
    assert plain["profiles"][0]["pluginConfig"] == profile["pluginConfig"]
    (ext,) = rose["extenders"]
    assert ext["urlPrefix"] == "http://127.0.0.1:1234"
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is True
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["preemptVerb"]) == (
        "filter",
        "prioritize",
        "preempt",
    )
    assert "bindVerb" not in ext


def test_pki_has_admin_in_system_masters_and_serving_sans(tmp_path: Path) -> None:
    p = generate(tmp_path)
    admin = x509.load_pem_x509_certificate(p.crt("admin").read_bytes())
    assert "O=system:masters" in admin.subject.rfc4514_string()
    srv = x509.load_pem_x509_certificate(p.crt("apiserver").read_bytes())
    sans = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert p.key("admin").stat().st_mode & 0o777 == 0o600


def test_port_in_use_sees_a_listener() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        assert port_in_use(s.getsockname()[1])


def test_handle_round_trips_through_json(tmp_path: Path) -> None:
    h = ClusterHandle(
        kubeconfig=tmp_path / "kc",
        server="https://127.0.0.1:1",
        node_names=["a"],
        gpus_per_node=2,
        extender_url=None,
        workdir=tmp_path,
        pools={"a": "pool-a"},
        ports={"etcd": 1},
    )
    assert ClusterHandle.from_json(h.to_json()) == h


def test_malformed_version_is_refused_before_any_build() -> None:
    with pytest.raises(BinariesError, match=r"not of the form v1\.MINOR\.PATCH"):
        binaries.ensure("1.37")


def test_a_reserved_port_is_free_and_below_the_ephemeral_range() -> None:
    """The port a cluster's extender binds only later comes from below the ephemeral range, so no
    bind to port 0 or outgoing connection of another run on the machine can take it meanwhile."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {reserved_port() for _ in range(20)}
    assert len(ports) > 1, "drawn at random"
    for port in ports:
        assert 20000 <= port < ephemeral_low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # free now


def test_a_reserved_port_is_never_drawn_twice_while_its_process_lives(tmp_path: Path) -> None:
    """Each draw is claimed in the registry: 300 draws from a narrow range of 1,000 ports never
    repeat one (at random, with no claim, a repeat in 300 draws of 1,000 is near certain)."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    low = ephemeral_low - 1000
    ports = [reserved_port(low, registry=tmp_path) for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all((tmp_path / str(p)).read_text() == str(os.getpid()) for p in ports if p < ephemeral_low)


def test_a_claim_of_a_process_that_is_gone_is_taken_over(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True, text=True
    )
    gone_pid = int(dead.stdout)
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    low = ephemeral_low - 1000
    for port in range(low, ephemeral_low):
        (tmp_path / str(port)).write_text(str(gone_pid))  # every port of the range claimed by a dead run
    port = reserved_port(low, registry=tmp_path)
    assert low <= port < ephemeral_low, "taken over, not given up for free_port()"
    assert (tmp_path / str(port)).read_text() == str(os.getpid())
