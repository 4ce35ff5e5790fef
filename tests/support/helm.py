"""Running the helm that hack/build-binaries.sh builds (pinned HELM_VERSION), with its config, cache
and data folders under a test's temporary directory so no user's helm setup leaks in."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def helm_bin() -> str:
    """The helm hack/build-binaries.sh builds from its Go module at the pinned HELM_VERSION."""
    from local_cluster.binaries import HACK, cache_dir

    env = dict(line.split("=", 1) for line in (HACK / "versions.env").read_text().splitlines() if "=" in line)
    path = cache_dir() / "bin" / f"helm-{os.environ.get('ROSE_HELM_VERSION', env['HELM_VERSION'])}" / "helm"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run hack/build-binaries.sh (it builds helm from helm.sh/helm/v3)")
    return str(path)


def helm(tmp: Path, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``helm *args`` that must exit 0."""
    r = helm_run(tmp, *args, kubeconfig=kubeconfig)
    assert r.returncode == 0, f"helm {' '.join(args)} exited {r.returncode}: {r.stderr}"
    return r


def helm_run(tmp: Path, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``helm *args`` in the repository root, whatever its exit status."""
    env = dict(
        os.environ,
        HELM_CONFIG_HOME=str(tmp / "cfg"),
        HELM_CACHE_HOME=str(tmp / "cache"),
        HELM_DATA_HOME=str(tmp / "data"),
    )
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(
        [helm_bin(), *args], text=True, capture_output=True, cwd=REPO, env=env, timeout=600, check=False
    )
