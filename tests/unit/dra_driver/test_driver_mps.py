"""The MPS daemon decisions of GPU shares (``dra_driver/mps.py``, pure) and where the driver may use
the manager at all (real GPUs only, ``--gpu-shares``, an existing binary). The daemons themselves
run in tests/contract/dra_driver/test_driver_mps_daemons.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dra_driver import cli, mps
from dra_driver.claims import PreparedDevice
from dra_driver.discovery import SimulatedConfig, discover_simulated
from dra_driver.metrics import DriverMetrics
from dra_driver.node import NodeDriver, NullNotifier
from rose_common import names
from tests.support.driver_fixtures import NODE, StaticClaims


def dev(role: str, gpu: int = 0) -> PreparedDevice:
    d = f"gpu-{gpu}-{role}"
    return PreparedDevice(("gpu",), "n", d, (f"gpu.rose.io/gpu=u-{d}",), gpu, f"GPU-{gpu}", role, 1, 5)


def test_each_gpu_has_its_own_pipe_and_log_directories() -> None:
    root = Path("/var/lib/kubelet/plugins/gpu.rose.io/mps")
    assert mps.dirs(root, 3) == mps.MpsDirs(root / "gpu-3" / "pipe", root / "gpu-3" / "log")


def test_the_daemon_sees_only_its_gpu_and_no_client_limits() -> None:
    d = mps.dirs(Path("/s/mps"), 1)
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1", names.ENV_MPS_MEM_LIMIT: "0=1M", "CUDA_MPS_X": "y"}
    assert mps.daemon_env(base, "GPU-b", d) == {
        "PATH": "/bin",
        "CUDA_VISIBLE_DEVICES": "GPU-b",
        names.ENV_MPS_PIPE_DIRECTORY: "/s/mps/gpu-1/pipe",
        names.ENV_MPS_LOG_DIRECTORY: "/s/mps/gpu-1/log",
    }


def test_rl_shares_and_serving_fractions_need_their_gpus_daemon() -> None:
    devices = [dev("share", 0), dev("servingshare", 2), dev("lendable", 1), dev("serving", 3)]
    assert mps.share_gpus(devices) == {0, 2}
    assert mps.share_gpus([dev("lendable"), dev("serving")]) == frozenset()


def test_daemons_stop_when_no_recorded_share_needs_them() -> None:
    assert mps.to_stop(wanted={0, 2}, running={0, 1, 2, 3}) == [1, 3]
    assert mps.to_stop(wanted={0}, running=set()) == []  # nothing to stop; starting is ensure's
    assert mps.to_stop(wanted=set(), running={5, 4}) == [4, 5]


def test_only_a_whole_gpu_lent_claim_is_held_back_by_a_daemon() -> None:
    running = {0, 1}
    assert mps.blocking_whole_lent([dev("lendable", 0), dev("lendable", 2)], running) == [0]
    assert mps.blocking_whole_lent([dev("serving", 1)], running) == []  # serving wins; it does not use MPS
    assert mps.blocking_whole_lent([dev("share", 1)], running) == []


def test_the_repair_loops_check_is_due_every_30_seconds(tmp_path: Path) -> None:
    m = mps.MpsDaemons("nvidia-cuda-mps-control", tmp_path, {0: "GPU-a"})
    assert m.due(100.0) and not m.due(100.0) and not m.due(129.9) and m.due(130.0) and not m.due(131.0)


def test_a_process_error_stays_one_line() -> None:
    assert mps.first_line("\n  \nfirst problem\nsecond\n") == "first problem"
    assert mps.first_line("x" * 500) == "x" * 200
    assert mps.first_line("") == ""


def test_bad_manager_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"the MPS control binary must be named \(--mps-control\)"):
        mps.MpsDaemons("", tmp_path, {0: "GPU-a"})
    with pytest.raises(ValueError, match=r"the MPS daemon timeouts must be > 0 s, got 0 and 3\.0"):
        mps.MpsDaemons("nvidia-cuda-mps-control", tmp_path, {0: "GPU-a"}, timeout_seconds=0)
    with pytest.raises(ValueError, match=r"the MPS daemon timeouts must be > 0 s, got 10\.0 and -1"):
        mps.MpsDaemons("nvidia-cuda-mps-control", tmp_path, {0: "GPU-a"}, stop_wait_seconds=-1)
    m = mps.MpsDaemons("nvidia-cuda-mps-control", tmp_path, {0: "GPU-a"})
    with pytest.raises(mps.MpsError, match="GPU 7 is not on this node"):
        m.env(7)
    assert not m.answers(0)  # no pipe directory: no daemon, and no process run to ask


def test_the_manager_is_never_used_on_simulated_gpus(tmp_path: Path) -> None:
    gpus = discover_simulated(NODE, SimulatedConfig(count=1))
    daemons = mps.MpsDaemons("nvidia-cuda-mps-control", tmp_path / "mps", {0: gpus[0].info.uuid})
    with pytest.raises(ValueError, match="MPS daemons run only on real GPUs"):
        NodeDriver(
            node_name=NODE,
            gpus=gpus,
            cdi_dir=tmp_path / "cdi",
            state_dir=tmp_path / "state",
            claims=StaticClaims(),
            engine=None,
            notifier=NullNotifier(),
            boot_id="b",
            mps_daemons=daemons,
        )


def test_the_cli_builds_the_manager_only_for_shares_on_real_gpus(tmp_path: Path) -> None:
    real = [replace(g, simulated=False) for g in discover_simulated(NODE, SimulatedConfig(count=2))]
    simulated = discover_simulated(NODE, SimulatedConfig(count=2))
    base = ["--node-name", NODE, "--gpu-backend", "nvml"]
    args = cli.build_parser().parse_args([*base, "--gpu-shares", "true", "--mps-control", "/bin/true"])
    metrics = DriverMetrics([0, 1])
    m = cli.build_mps(args, real, tmp_path, metrics)
    assert isinstance(m, mps.MpsDaemons) and m.root == tmp_path / "mps" and m.control == "/bin/true"
    assert m.uuids == {0: real[0].info.uuid, 1: real[1].info.uuid}
    m.counters.daemons(2)
    m.counters.start_failed()
    sample = metrics.registry.get_sample_value
    assert sample("rose_driver_mps_daemons") == 2 and sample("rose_driver_mps_start_failures_total") == 1
    assert sample("rose_driver_mps_stop_failures_total") == 0
    assert cli.build_mps(args, simulated, tmp_path, metrics) is None  # never chosen on simulated GPUs
    off = cli.build_parser().parse_args([*base, "--mps-control", "/bin/true"])
    assert cli.build_mps(off, real, tmp_path, metrics) is None  # no --gpu-shares: no share to serve
    assert cli.build_parser().parse_args(base).mps_control == "nvidia-cuda-mps-control"
    missing = cli.build_parser().parse_args([*base, "--gpu-shares", "true", "--mps-control", "no-such-mps-control"])
    with pytest.raises(cli.StartupError, match=r"^--mps-control 'no-such-mps-control': no such executable"):
        cli.build_mps(missing, real, tmp_path, metrics)
