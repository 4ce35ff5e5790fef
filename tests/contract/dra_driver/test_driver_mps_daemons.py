"""GPU shares' MPS control daemons (issue 27 §3, ``dra_driver/mps.py``) with real processes.

There is no GPU here, so the control binary is the explicit, named stand-in
``tests/support/fake_nvidia_cuda_mps_control.py`` (``-d`` daemonizes and serves a control socket in
``CUDA_MPS_PIPE_DIRECTORY``; a client's ``quit`` stops it); everything else is the driver's own
code: the manager, and the node driver preparing share claims on GPUs it takes for real ones. The
real binary runs in tests/device/dra_driver/test_gpu_share_mps.py (not yet on a GPU).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_driver import cdi
from dra_driver.claims import ClaimRef
from dra_driver.discovery import SimulatedConfig, discover_simulated
from dra_driver.mps import MpsCounters, MpsDaemons, MpsError, dirs
from dra_driver.node import EVENT_MPS_DAEMON_FAILED, NodeDriver
from tests.support.driver_fixtures import NODE, NS, RecordingEngine, RecordingNotifier, StaticClaims, make_claim

FAKE = str(Path(__file__).resolve().parents[2] / "support" / "fake_nvidia_cuda_mps_control.py")
UUIDS = {0: "GPU-fake-0", 1: "GPU-fake-1"}


@pytest.fixture
def root() -> Iterator[Path]:
    """A short directory (the fake's socket path stays short anyway); every fake daemon started
    under it is killed by its pid at the end."""
    d = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))
    try:
        yield d / "mps"
    finally:
        for pidfile in d.glob("mps/gpu-*/pipe/fake-mps-control.pid"):
            with contextlib.suppress(ValueError, OSError):
                pid = int(pidfile.read_text())
                if alive(pid) and b"fake_nvidia_cuda_mps_control" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)  # still ours, still running
        shutil.rmtree(d, ignore_errors=True)


def daemon_pid(root: Path, gpu: int) -> int:
    return int((dirs(root, gpu).pipe / "fake-mps-control.pid").read_text())


def alive(pid: int) -> bool:
    """Running, not a zombie (a stopped daemon is reparented to init, which may not reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def kill(pid: int) -> None:
    """SIGKILL a fake daemon and wait until it is dead (the signal is delivered asynchronously)."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not alive(pid), f"fake daemon {pid} still alive 10 s after SIGKILL"


class Counted:
    def __init__(self) -> None:
        self.daemons, self.start_failed, self.stop_failed = -1, 0, 0

    def counters(self) -> MpsCounters:
        def daemons(n: int) -> None:
            self.daemons = n

        def start() -> None:
            self.start_failed += 1

        def stop() -> None:
            self.stop_failed += 1

        return MpsCounters(daemons=daemons, start_failed=start, stop_failed=stop)


def manager(root: Path, counted: Counted | None = None, timeout_seconds: float = 5.0, **kw: Any) -> MpsDaemons:
    counters = (counted or Counted()).counters()
    return MpsDaemons(FAKE, root, UUIDS, counters=counters, timeout_seconds=timeout_seconds, **kw)


def test_start_adopt_after_restart_and_stop(root: Path) -> None:
    counted = Counted()
    m = manager(root, counted)
    m.ensure([0])
    pid = daemon_pid(root, 0)
    assert alive(pid) and m.running() == {0} and counted.daemons == 1
    log = (dirs(root, 0).log / "control.log").read_text()
    assert log == f"started pid={pid} CUDA_VISIBLE_DEVICES=GPU-fake-0\n"  # one daemon, on that GPU only
    m.ensure([0])  # a second share on the GPU: the same daemon
    assert daemon_pid(root, 0) == pid

    restarted = manager(root, counted)  # a new driver process beside the running daemon
    assert restarted.adopt() == [0] and restarted.running() == {0}
    restarted.ensure([0])
    assert daemon_pid(root, 0) == pid
    assert (dirs(root, 0).log / "control.log").read_text() == log  # not started twice

    assert restarted.sync([0]) == [] and alive(pid)  # still wanted: kept
    assert restarted.sync([]) == []
    assert not alive(pid) and not restarted.answers(0) and restarted.running() == frozenset()
    assert counted.daemons == 0 and counted.start_failed == counted.stop_failed == 0


def test_a_daemon_that_died_is_started_again(root: Path) -> None:
    m = manager(root)
    m.ensure([1])
    first = daemon_pid(root, 1)
    kill(first)  # it leaves its control socket behind
    m.ensure([1])
    assert daemon_pid(root, 1) != first and alive(daemon_pid(root, 1)) and m.answers(1)


def test_start_failures_are_one_line_errors(root: Path) -> None:
    counted = Counted()
    failing = manager(root, counted, base_env=dict(os.environ, FAKE_MPS_CONTROL_FAIL_START="cannot open the GPU"))
    with pytest.raises(MpsError, match=r"^MPS control daemon for GPU 0 exited 1 at start: cannot open the GPU$"):
        failing.ensure([0])
    assert failing.running() == frozenset() and counted.start_failed == 1 and counted.daemons == 0

    slow = MpsDaemons(
        FAKE, root, UUIDS, timeout_seconds=1.0, base_env=dict(os.environ, FAKE_MPS_CONTROL_START_DELAY="30")
    )
    never = r"^MPS control daemon for GPU 1 did not answer within 1s of its start \(log: .*gpu-1/log\)$"
    with pytest.raises(MpsError, match=never):
        slow.ensure([1])

    missing = MpsDaemons("/nonexistent/nvidia-cuda-mps-control", root, UUIDS)
    with pytest.raises(MpsError, match=r"^MPS control binary '/nonexistent/nvidia-cuda-mps-control' not found"):
        missing.ensure([0])


# ------------------------------------------------------------------------------ the node driver
def share_claim(uid: str, device: str = "gpu-0-share") -> dict[str, Any]:
    c: dict[str, Any] = make_claim(uid, uid, [("gpu", device)], pod=(f"p-{uid}", f"pod-{uid}"))
    res = c["status"]["allocation"]["devices"]["results"][0]
    if device.endswith("share"):
        res["consumedCapacity"] = {"memory": "20Gi", "compute": "25"}
        res["shareID"] = f"share-{uid}"
    return c


def gpu_driver(tmp: Path, claims: StaticClaims, daemons: MpsDaemons, notifier: Any = None) -> NodeDriver:
    """A node driver on two GPUs taken for real ones (their UUIDs are the manager's)."""
    gpus = [
        replace(g, info=replace(g.info, uuid=UUIDS[g.info.index]), simulated=False)
        for g in discover_simulated(NODE, SimulatedConfig(count=2))
    ]
    d = NodeDriver(
        node_name=NODE,
        gpus=gpus,
        cdi_dir=tmp / "cdi",
        state_dir=tmp / "state",
        claims=claims,
        engine=RecordingEngine(),
        notifier=notifier or RecordingNotifier(),
        boot_id="boot-1",
        mps_daemons=daemons,
    )
    d.recover()
    return d


def ref(uid: str) -> ClaimRef:
    return ClaimRef(NS, uid, uid)


def test_the_driver_runs_one_daemon_per_shared_gpu_while_shares_need_it(root: Path, tmp_path: Path) -> None:
    claims = StaticClaims([share_claim("s1"), share_claim("s2"), share_claim("w1", "gpu-0-lendable")])
    d = gpu_driver(tmp_path, claims, manager(root))
    assert not d.prepare([ref("s1")])["s1"].error
    pid = daemon_pid(root, 0)
    spec = json.loads((tmp_path / "cdi" / cdi.spec_filename("s1")).read_text())
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert mounts["/run/nvidia/mps/pipe"] == str(dirs(root, 0).pipe)  # the daemon's own directory
    assert not d.prepare([ref("s2")])["s2"].error and daemon_pid(root, 0) == pid

    # the driver restarts while both shares run: the daemon is adopted, not started again
    d.close()
    d = gpu_driver(tmp_path, claims, manager(root))
    assert d.mps is not None and d.mps.running() == {0} and daemon_pid(root, 0) == pid

    assert d.unprepare([ref("s1")]) == {"s1": ""} and alive(pid)  # s2 still needs it
    assert d.unprepare([ref("s2")]) == {"s2": ""} and not alive(pid)  # the last share gone: stopped
    assert d.mps.running() == frozenset()
    assert not d.prepare([ref("w1")])["w1"].error  # the GPU lent whole, no daemon on it
    assert not dirs(root, 0).pipe.joinpath("control").exists()
    d.close()


def test_the_repair_loop_starts_a_dead_daemon_again_for_prepared_shares(root: Path, tmp_path: Path) -> None:
    d = gpu_driver(tmp_path, StaticClaims([share_claim("s1")]), manager(root))
    assert not d.prepare([ref("s1")])["s1"].error
    first = daemon_pid(root, 0)
    kill(first)  # a share's new container would run without its limits
    d.reconcile()
    second = daemon_pid(root, 0)
    assert second != first and alive(second)
    kill(second)
    d.reconcile()  # checked at most every 30 s: one control-client call per shared GPU each time
    assert daemon_pid(root, 0) == second and not d.mps.answers(0)  # type: ignore[union-attr]
    d.close()


def test_recovery_stops_an_unneeded_daemon_and_a_whole_gpu_claim_waits_for_its_stop(root: Path, tmp_path: Path) -> None:
    stray = manager(root)
    stray.ensure([1])  # left by an earlier driver with no share recorded any more
    pid = daemon_pid(root, 1)
    counted = Counted()
    claims = StaticClaims([share_claim("s1", "gpu-1-share"), share_claim("w1", "gpu-1-lendable")])
    d = gpu_driver(tmp_path, claims, manager(root, counted))
    assert not alive(pid) and counted.daemons == 0  # adopted at recovery, then stopped: nothing needs it

    assert not d.prepare([ref("s1")])["s1"].error
    pid = daemon_pid(root, 1)
    (dirs(root, 1).pipe / "fake-ignore-quit").touch()  # quit acknowledged, the daemon stays
    assert d.unprepare([ref("s1")]) == {"s1": ""}  # the claim goes; the stop failed and is counted
    assert alive(pid) and counted.stop_failed == 1 and counted.daemons == 1
    err = d.prepare([ref("w1")])["w1"].error  # the whole GPU is not lent beside a daemon
    assert err == (
        f"ResourceClaim {NS}/w1: MPS control daemon for GPU 1 still answers 3s after quit (log: {dirs(root, 1).log});"
        " the kubelet retries"
    )
    assert counted.stop_failed == 2
    (dirs(root, 1).pipe / "fake-ignore-quit").unlink()
    assert not d.prepare([ref("w1")])["w1"].error  # the kubelet's retry: stopped first, then prepared
    assert not alive(pid) and counted.daemons == 0
    d.close()


def test_a_share_whose_daemon_does_not_start_is_not_prepared(root: Path, tmp_path: Path) -> None:
    notifier = RecordingNotifier()
    bad = MpsDaemons(FAKE, root, UUIDS, base_env=dict(os.environ, FAKE_MPS_CONTROL_FAIL_START="no device"))
    d = gpu_driver(tmp_path, StaticClaims([share_claim("s1")]), bad, notifier)
    err = d.prepare([ref("s1")])["s1"].error
    assert err == (
        f"ResourceClaim {NS}/s1: MPS control daemon for GPU 0 exited 1 at start: no device; the kubelet retries"
    )
    assert "\n" not in err and not (tmp_path / "cdi" / cdi.spec_filename("s1")).exists()
    assert [e[1] for e in notifier.events] == [EVENT_MPS_DAEMON_FAILED]
    d.close()
