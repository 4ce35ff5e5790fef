"""Pure parts of the real node (local_cluster/realnode.py): the host-python image and its mounts,
and the `rose cluster status` rows of the real node."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from local_cluster.realnode import (
    HOST_PYTHON_LINKS,
    HOST_PYTHON_REF,
    host_python_archive,
    host_python_mounts,
    real_node_status,
)


def _index(archive: Path) -> dict[str, Any]:
    with tarfile.open(archive) as outer:
        f = outer.extractfile("./index.json")
        assert f is not None
        return dict(json.load(f))


def _layer(archive: Path) -> tarfile.TarFile:
    index = _index(archive)
    with tarfile.open(archive) as outer:
        man = json.load(outer.extractfile(f"./blobs/sha256/{index['manifests'][0]['digest'][7:]}"))  # type: ignore[arg-type]
        layer = outer.extractfile(f"./blobs/sha256/{man['layers'][0]['digest'][7:]}")
        assert layer is not None
        return tarfile.open(fileobj=io.BytesIO(layer.read()), mode="r:gz")


def test_host_python_archive_holds_the_merged_usr_links_and_is_deterministic(tmp_path: Path) -> None:
    a = host_python_archive(tmp_path / "a.tar")
    index = _index(a)
    assert index == _index(host_python_archive(tmp_path / "b.tar"))  # the same manifest digest
    assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == HOST_PYTHON_REF
    layer = _layer(a)
    links = {m.name: m.linkname for m in layer.getmembers() if m.issym()}
    assert links == HOST_PYTHON_LINKS
    assert {m.name for m in layer.getmembers() if m.isfile()} == {"tmp/.keep", "etc/ld.so.cache"}


def test_host_python_mounts_keep_each_tree_once() -> None:
    got = host_python_mounts([Path("/work/main/.venv"), Path("/usr/lib/python3.11")], Path("/work/main"))
    assert got == [("/etc/ld.so.cache", "File"), ("/usr", "Directory"), ("/work/main", "Directory")]


def test_real_node_status_rows(tmp_path: Path) -> None:
    assert real_node_status(tmp_path) == []  # no real node started here
    (tmp_path / "pids").mkdir()
    (tmp_path / "logs").mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "pids" / "realnode-containerd.pid").write_text(str(os.getpid()))
    (tmp_path / "pids" / "realnode-kubelet.pid").write_text(str(dead.pid))
    (tmp_path / "logs" / "realnode-kubelet.log").write_text("E1130 failed to run Kubelet: boom\n")
    rows = {r["component"]: r for r in real_node_status(tmp_path)}
    assert set(rows) == {"realnode-containerd", "realnode-kubelet"}  # no shim of this socket runs
    assert rows["realnode-containerd"]["alive"] and "log_tail" not in rows["realnode-containerd"]
    assert not rows["realnode-kubelet"]["alive"] and "boom" in rows["realnode-kubelet"]["log_tail"]
