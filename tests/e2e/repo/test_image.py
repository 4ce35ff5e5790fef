"""The image, built without a Docker engine and run: hack/build-image.sh (buildah, vfs storage)
writes an OCI archive; the archive is imported into a fresh buildah storage and `rose` runs in it
under runc, the OCI runtime from Debian (Debian's crun refuses this machine's hybrid cgroup setup).

I/O: runs hack/build-image.sh (debootstrap from the Debian mirror on the first run, PyPI wheels),
buildah and runc as root; writes only under pytest's tmp_path and $ROSE_CACHE_DIR/image.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _missing() -> str | None:
    tools = [t for t in ("buildah", "runc", "debootstrap") if shutil.which(t) is None]
    if tools:
        return f"{', '.join(tools)} not installed (apt-get install buildah runc debootstrap; hack/setup.sh does)"
    if os.geteuid() != 0:
        return "hack/build-image.sh needs root (buildah vfs storage, debootstrap)"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


def bh(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = ["buildah", "--root", str(store / "root"), "--runroot", str(store / "run"), "--storage-driver", "vfs", *args]
    r = subprocess.run(cmd, text=True, capture_output=True, timeout=600, check=False)
    assert r.returncode == 0, f"{' '.join(args)}: {r.stderr}"
    return r


def build(tmp_path_factory: pytest.TempPathFactory, target: str) -> Iterator[tuple[Path, str]]:
    """The archive build-image.sh writes for ``target``, imported into a storage of its own, and a
    container of it."""
    out = tmp_path_factory.mktemp("image") / f"{target}.tar"
    env = dict(os.environ, ROSE_IMAGE_OUT=str(out), ROSE_IMAGE_TARGET=target)
    r = subprocess.run(
        ["bash", "hack/build-image.sh"], cwd=REPO, env=env, text=True, capture_output=True, timeout=1800, check=False
    )
    assert r.returncode == 0, r.stderr
    store = tmp_path_factory.mktemp("store")
    ctr = bh(store, "from", "--pull-never", f"oci-archive:{out}").stdout.strip()
    yield store, ctr
    subprocess.run(
        [
            "buildah",
            "--root",
            str(store / "root"),
            "--runroot",
            str(store / "run"),
            "--storage-driver",
            "vfs",
            "rm",
            "--all",
        ],
        capture_output=True,
        check=False,
    )


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    yield from build(tmp_path_factory, "rose")


@pytest.fixture(scope="module")
def driver_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    yield from build(tmp_path_factory, "driver")


def run_in(image: tuple[Path, str], *argv: str) -> str:
    store, ctr = image
    return bh(store, "run", "--isolation", "oci", "--runtime", shutil.which("runc") or "runc", ctr, "--", *argv).stdout


def test_rose_runs_in_the_image_as_non_root(image: tuple[Path, str]) -> None:
    """`rose --help` (and `rose version` where the CLI has it) run under runc, as uid 65532."""
    help_text = run_in(image, "rose", "--help")
    assert "driver" in help_text and "extender" in help_text and "predictor" in help_text, help_text
    if " version" in help_text:
        assert run_in(image, "rose", "version").strip()
    assert run_in(image, "id", "-u").strip() == "65532"


def test_the_image_does_not_ship_the_development_harness(image: tuple[Path, str]) -> None:
    """local_cluster (the control plane as local processes) is for development only (README): not in
    the image, and `rose cluster` there says so in one line."""
    found = "import importlib.util as u; print(u.find_spec('local_cluster'))"
    assert run_in(image, "python3", "-c", found).strip() == "None"
    store, ctr = image
    cmd = ["buildah", "--root", str(store / "root"), "--runroot", str(store / "run"), "--storage-driver", "vfs"]
    cmd += ["run", "--isolation", "oci", "--runtime", shutil.which("runc") or "runc", ctr, "--", "rose", "cluster"]
    r = subprocess.run(cmd, text=True, capture_output=True, timeout=120, check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    # buildah adds a line of its own ("while running runtime: exit status 2") after rose's one line
    assert "rose: 'cluster' is not available in this build (local_cluster.cli is missing)" in r.stderr, r.stderr


def test_the_image_has_no_compiler(image: tuple[Path, str]) -> None:
    """Multi-stage: the final image carries the virtual environment, not a toolchain."""
    found = run_in(image, "sh", "-c", "for c in gcc cc g++ clang make; do command -v $c; done; true")
    assert found.strip() == "", found


def test_the_driver_image_carries_only_the_driver(driver_image: tuple[Path, str]) -> None:
    """--target driver: `rose driver` runs (as root, which its DaemonSet asks for) and imports its
    whole package; the predictor's scientific stack, kubectl and local_cluster are not in it."""
    assert "--node-name" in run_in(driver_image, "rose", "driver", "--help")
    assert run_in(driver_image, "id", "-u").strip() == "0"
    mods = "dra_driver.node, dra_driver.plugin, dra_driver.publisher, dra_driver.suspend"
    run_in(driver_image, "python3", "-c", f"import {mods}")
    heavy = "('sklearn', 'scipy', 'pandas', 'numpy', 'prometheus_api_client', 'local_cluster')"
    absent = f"import importlib.util as u; print([m for m in {heavy} if u.find_spec(m)])"
    assert run_in(driver_image, "python3", "-c", absent).strip() == "[]"
    assert run_in(driver_image, "sh", "-c", "command -v kubectl; true").strip() == ""
