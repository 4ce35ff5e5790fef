from __future__ import annotations

import sys

import pytest

from dra_driver import cli, discovery


def test_simulated_backend_is_deterministic_and_validated() -> None:
    a = discovery.discover("simulated", "n", discovery.SimulatedConfig(count=3, memory_bytes=10, host_link_gbps=25))
    assert [g.info.index for g in a] == [0, 1, 2] and all(g.simulated and g.host_link_gbps == 25 for g in a)
    assert a == discovery.discover(
        "simulated", "n", discovery.SimulatedConfig(count=3, memory_bytes=10, host_link_gbps=25)
    )
    with pytest.raises(discovery.DiscoveryError, match="between 0 and 64"):
        discovery.discover("simulated", "n", discovery.SimulatedConfig(count=65))
    with pytest.raises(discovery.DiscoveryError, match="unknown --gpu-backend"):
        discovery.discover("fake", "n")


def test_nvml_without_pynvml_is_a_clear_error_not_a_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as on a machine without nvidia-ml-py
    with pytest.raises(discovery.DiscoveryError, match=r"nvidia-ml-py.*--gpu-backend=simulated"):
        discovery.discover("nvml", "n")


def test_every_flag_has_an_env_twin_in_help() -> None:
    p = cli.build_parser()
    help_text = p.format_help().replace("\n", " ")
    flags = [a.option_strings[0] for a in p._actions if a.option_strings and a.option_strings[0] != "-h"]
    assert "--gpu-backend" in flags and "--metrics-port" in flags and "--host-memory-budget" in flags
    for f in flags:
        assert cli._env(f[2:]) in help_text.replace(" ", ""), f


def test_env_twin_sets_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROSE_DRIVER_NODE_NAME", "n7")
    monkeypatch.setenv("ROSE_DRIVER_GPU_BACKEND", "simulated")
    monkeypatch.setenv("ROSE_DRIVER_HOST_MEMORY_BUDGET", "2Gi")
    a = cli.build_parser().parse_args([])
    assert a.node_name == "n7" and a.gpu_backend == "simulated" and a.host_memory_budget == 2 * 1024**3


def test_parse_bytes() -> None:
    assert cli.parse_bytes("64Gi") == 64 * 2**30 and cli.parse_bytes("500M") == 500 * 10**6
    with pytest.raises(Exception, match="not a byte quantity"):
        cli.parse_bytes("lots")


def test_missing_backend_exits_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--node-name", "n"])
    assert e.value.code == 2 and "--gpu-backend" in capsys.readouterr().err
