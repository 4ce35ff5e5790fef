"""`rose cluster` life cycle on the real binaries, and its errors for bad input."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from local_cluster import (
    BinariesError,
    ClusterConfig,
    ClusterError,
    LocalCluster,
    binaries,
    port_in_use,
)
from local_cluster.cluster import COMPONENTS

REPO = Path(__file__).resolve().parents[3]


def _processes_mentioning(text: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if text in cmd and stat.split(") ", 1)[1][0] != "Z":
            out.append(int(d.name))
    return out


def _rose(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rose_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_up_status_env_down_leaves_no_process_and_no_port(tmp_path: Path) -> None:
    d = tmp_path / "c"
    up = _rose("cluster", "--dir", str(d), "up", "--nodes", "2", "--gpus-per-node", "1", "--extender-url", "")
    assert up.returncode == 0, up.stderr
    assert "export KUBECONFIG=" in up.stdout
    lc = LocalCluster(ClusterConfig(workdir=d))
    handle = lc.handle()
    assert len(handle.node_names) == 2
    listening = [p for c, p in handle.ports.items() if c != "etcd-peer"]
    assert all(port_in_use(p) for p in listening)
    pids = _processes_mentioning(str(d))
    assert len(pids) >= len(COMPONENTS)

    st = _rose("cluster", "--dir", str(d), "status")
    assert st.returncode == 0, st.stdout + st.stderr
    assert st.stdout.count("running") == len(COMPONENTS)
    env = _rose("cluster", "--dir", str(d), "env")
    assert env.stdout.strip() == f"export KUBECONFIG={handle.kubeconfig}"

    # a component that dies is reported with the tail of its log
    kwok_pid = int((d / "pids" / "kwok.pid").read_text())
    os.kill(kwok_pid, signal.SIGKILL)
    time.sleep(0.5)
    st = _rose("cluster", "--dir", str(d), "status")
    assert st.returncode == 1
    assert "kwok" in st.stdout and "DIED" in st.stdout and "last log lines" in st.stdout

    down = _rose("cluster", "--dir", str(d), "down")
    assert down.returncode == 0, down.stderr
    assert _processes_mentioning(str(d)) == []
    # The apiserver finished its graceful shutdown on SIGTERM (etcd stops after it): stopped with
    # etcd, it retried an etcd write for 20 s and every teardown waited for the SIGKILL.
    apiserver_log = (d / "logs" / "kube-apiserver.log").read_text(errors="replace")
    assert "[graceful-termination] apiserver is exiting" in apiserver_log
    # Nothing accepts connections there any more. (Not "nothing bound": after the components
    # exit, the kernel may hand the same number to some other test's outgoing connection as its
    # ephemeral source port, which makes bind() fail without anything listening.)
    still = {c: p for c, p in handle.ports.items() if p in listening and _accepts(p)}
    assert still == {}, f"still accepting connections after down: {still}"


def _accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def occupied_port() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield int(s.getsockname()[1])
    s.close()


def test_port_already_in_use_is_refused_with_the_fix(tmp_path: Path, occupied_port: int) -> None:
    with pytest.raises(ClusterError) as e:
        LocalCluster(ClusterConfig(workdir=tmp_path, apiserver_port=occupied_port)).up()
    msg = str(e.value)
    assert f"port {occupied_port}" in msg and "kube-apiserver" in msg and "--apiserver-port" in msg
    assert _processes_mentioning(str(tmp_path)) == []


def test_malformed_kubernetes_version_is_refused(tmp_path: Path) -> None:
    r = _rose("cluster", "--dir", str(tmp_path), "up", "--kubernetes-version", "latest")
    assert r.returncode == 1
    assert "not of the form v1.MINOR.PATCH" in r.stderr


def test_unknown_kubernetes_version_names_available_ones(tmp_path: Path) -> None:
    r = _rose(
        "cluster",
        "--dir",
        str(tmp_path / "c"),
        "up",
        "--kubernetes-version",
        "v1.99.0",
        env={"ROSE_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert r.returncode == 1
    assert "unknown version v1.99.0 of k8s.io/kubernetes" in r.stderr
    assert "Available recent versions" in r.stderr


def test_no_go_toolchain_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROSE_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no go here
    if shutil.which("go"):
        pytest.fail("/usr/bin or /bin holds a go binary; this test needs a PATH without one")
    with pytest.raises(BinariesError, match="no Go toolchain on PATH"):
        binaries.ensure()
    r = subprocess.run(
        ["bash", str(REPO / "hack" / "build-binaries.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert r.returncode == 1 and "no Go toolchain on PATH" in r.stderr


def test_corrupt_cache_entry_is_rebuilt_not_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = binaries.ensure()
    cache = tmp_path / "cache"
    (cache / "bin").mkdir(parents=True)
    # every other entry (kubernetes, kwok, helm, minio…): the real (verified) one; etcd: a copy we corrupt
    for entry in real.etcd.parent.parent.iterdir():
        if entry.is_dir() and entry != real.etcd.parent:
            (cache / "bin" / entry.name).symlink_to(entry)
    etcd_dir = cache / "bin" / real.etcd.parent.name
    shutil.copytree(real.etcd.parent, etcd_dir)
    with open(etcd_dir / "etcd", "ab") as f:
        f.write(b"\0corrupt")
    monkeypatch.setenv("ROSE_CACHE_DIR", str(cache))
    r = subprocess.run(
        ["bash", str(REPO / "hack" / "build-binaries.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "ROSE_CACHE_DIR": str(cache)},
        check=False,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "etcd v3" in r.stderr and "cache entry incomplete, corrupt or built with other flags, rebuilding" in r.stderr
    assert r.stderr.count("rebuilding") == 1, "only the corrupt entry is rebuilt"
    rebuilt = binaries.ensure(build=False)
    assert rebuilt.etcd == etcd_dir / "etcd"
    out = subprocess.run([str(rebuilt.etcd), "--version"], capture_output=True, text=True, check=True)
    assert real.versions.etcd.lstrip("v") in out.stdout
