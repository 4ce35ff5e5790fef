from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dra_driver import cli, discovery
from rose_common.cli import env_name


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
        assert env_name(cli.ENV_PREFIX, f) in help_text.replace(" ", ""), f


def test_env_twin_sets_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROSE_DRIVER_NODE_NAME", "n7")
    monkeypatch.setenv("ROSE_DRIVER_GPU_BACKEND", "simulated")
    monkeypatch.setenv("ROSE_DRIVER_HOST_MEMORY_BUDGET", "2Gi")
    a = cli.build_parser().parse_args([])
    assert a.publish_slices is True and a.metrics_port == 9400
    assert a.node_name == "n7" and a.gpu_backend == "simulated" and a.host_memory_budget == 2 * 1024**3


def test_env_twin_is_validated_like_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (issue 9 defect 3): ROSE_DRIVER_PUBLISH_SLICES=yes silently turned publishing off
    while --publish-slices yes was refused; now both are refused, the env message names the
    variable, the value and the allowed values."""
    required = ["--node-name", "n", "--gpu-backend", "simulated"]
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([*required, "--publish-slices", "yes"])
    capsys.readouterr()
    monkeypatch.setenv("ROSE_DRIVER_PUBLISH_SLICES", "yes")
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(required)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "ROSE_DRIVER_PUBLISH_SLICES='yes'" in err and "true or false" in err, err
    monkeypatch.setenv("ROSE_DRIVER_PUBLISH_SLICES", "false")
    monkeypatch.setenv("ROSE_DRIVER_WATCH_PODS", "true")
    a = cli.build_parser().parse_args(required)
    assert a.publish_slices is False and a.watch_pods is True
    assert cli.build_parser().parse_args([*required, "--publish-slices", "true"]).publish_slices is True
    monkeypatch.setenv("ROSE_DRIVER_SUSPEND_ENGINE", "bogus")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(required)
    assert "ROSE_DRIVER_SUSPEND_ENGINE='bogus'" in capsys.readouterr().err


def test_missing_backend_exits_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--node-name", "n"])
    assert e.value.code == 2 and "--gpu-backend" in capsys.readouterr().err


def test_startup_errors_name_what_to_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--node-name", "n", "--gpu-backend", "simulated", "--metrics-port", "-1"]
    assert cli.main([*base, "--kubeconfig", str(tmp_path / "missing")]) == 2
    assert f"cannot build an API client from {tmp_path / 'missing'}" in capsys.readouterr().err
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    args = [*base, "--kubeconfig", str(kubeconfig), "--plugin-dir", str(tmp_path / "plugin")]
    assert cli.main([*args, "--suspended-cpu", "64K"]) == 2
    assert "--suspended-cpu: not a quantity: '64K'" in capsys.readouterr().err
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "checkpoint.json").write_text("{not json")
    assert cli.main([*args, "--boot-id-file", str(kubeconfig)]) == 3
    assert "checkpoint.json is corrupt" in capsys.readouterr().err
