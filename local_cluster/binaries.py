"""Where the real Kubernetes binaries are, and building them when they are not there.

``hack/build-binaries.sh`` builds etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok from their Go modules at the versions pinned in
``hack/versions.env`` into a cache outside the repository, keyed by version.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
HACK = REPO_ROOT / "hack"
_VERSION_RE = re.compile(r"^v\d+\.\d+\.\d+$")


class BinariesError(RuntimeError):
    """The binaries could not be found or built; the message says what to do."""


@dataclass(frozen=True)
class Versions:
    kubernetes: str
    etcd: str
    kwok: str


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kwok: Path
    kwok_stages: Path
    versions: Versions


def cache_dir() -> Path:
    env = os.environ.get("ROSE_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "rose"


def pinned_versions() -> Versions:
    """The versions in hack/versions.env, overridden by ROSE_K8S_VERSION and friends."""
    values: dict[str, str] = {}
    for line in (HACK / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            values[k.strip()] = v.strip()
    return Versions(
        kubernetes=os.environ.get("ROSE_K8S_VERSION", values["K8S_VERSION"]),
        etcd=os.environ.get("ROSE_ETCD_VERSION", values["ETCD_VERSION"]),
        kwok=os.environ.get("ROSE_KWOK_VERSION", values["KWOK_VERSION"]),
    )


def _paths(v: Versions) -> Binaries:
    b = cache_dir() / "bin"
    k8s = b / f"kubernetes-{v.kubernetes}"
    kwok = b / f"kwok-{v.kwok}"
    return Binaries(
        etcd=b / f"etcd-{v.etcd}" / "etcd",
        kube_apiserver=k8s / "kube-apiserver",
        kube_controller_manager=k8s / "kube-controller-manager",
        kube_scheduler=k8s / "kube-scheduler",
        kwok=kwok / "kwok",
        kwok_stages=kwok / "kwok-stages.yaml",
        versions=v,
    )


def _stamps_ok(bins: Binaries) -> bool:
    dirs = {bins.etcd.parent, bins.kube_apiserver.parent, bins.kwok.parent}
    for d in dirs:
        stamp = d / ".sha256"
        if not stamp.exists():
            return False
        r = subprocess.run(["sha256sum", "--quiet", "-c", ".sha256"], cwd=d, capture_output=True, check=False)
        if r.returncode != 0:
            return False
    return True


def ensure(kubernetes_version: str | None = None, build: bool = True) -> Binaries:
    """Return the binaries, building any that are missing or whose cache entry is corrupt."""
    v = pinned_versions()
    if kubernetes_version is not None:
        if not _VERSION_RE.match(kubernetes_version):
            raise BinariesError(
                f"Kubernetes version {kubernetes_version!r} is not of the form v1.MINOR.PATCH (e.g. {v.kubernetes})"
            )
        v = Versions(kubernetes=kubernetes_version, etcd=v.etcd, kwok=v.kwok)
    bins = _paths(v)
    if _stamps_ok(bins):
        return bins
    if not build:
        raise BinariesError(
            f"binaries for Kubernetes {v.kubernetes} are not built in {cache_dir()}; run hack/build-binaries.sh"
        )
    if shutil.which("go") is None:
        raise BinariesError(
            "no Go toolchain on PATH: the local cluster builds kube-apiserver, etcd and kwok from their Go "
            "modules. Install Go >= 1.26 (https://go.dev/doc/install) and re-run."
        )
    env = dict(os.environ)
    env.update(ROSE_K8S_VERSION=v.kubernetes, ROSE_ETCD_VERSION=v.etcd, ROSE_KWOK_VERSION=v.kwok)
    env["ROSE_CACHE_DIR"] = str(cache_dir())
    r = subprocess.run(["bash", str(HACK / "build-binaries.sh")], env=env, check=False, stdout=subprocess.DEVNULL)
    if r.returncode != 0:
        raise BinariesError(
            f"building the Kubernetes {v.kubernetes} binaries failed (exit {r.returncode}); see the messages above"
        )
    if not _stamps_ok(bins):
        raise BinariesError(f"the build finished but {cache_dir()} does not hold verified binaries")
    return bins
