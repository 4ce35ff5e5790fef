"""Test tiers and the shared end-to-end cluster.

The tier marker (unit, contract, e2e, device) comes from the folder a test lives in, so no
test can land in a tier by accident. The ``cluster`` fixture brings one real local cluster up
per session (or uses the one ``KUBECONFIG`` names when ``ROSE_USE_KUBECONFIG=1``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported where used: the device tier collects without local_cluster's dependencies
    from local_cluster import ClusterHandle

TIERS = ("unit", "contract", "e2e", "device")
REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(REPO_ROOT / "tests")
        tier = rel.parts[0] if len(rel.parts) > 1 else None
        if tier not in TIERS:
            raise pytest.UsageError(f"{rel}: tests live in one of tests/{{{','.join(TIERS)}}}/")
        item.add_marker(getattr(pytest.mark, tier))


def traces_dir() -> Path:
    """The real traces (ROSE_TRACES_DIR, default ../shared/data/traces); missing is a failure."""
    d = Path(os.environ.get("ROSE_TRACES_DIR", REPO_ROOT.parent / "shared" / "data" / "traces"))
    if not d.is_dir():
        pytest.fail(f"traces folder {d} is missing: set ROSE_TRACES_DIR to the shared traces")
    return d


@pytest.fixture(scope="session")
def traces() -> Path:
    return traces_dir()


def _existing_cluster() -> ClusterHandle:
    """A handle on the user's own cluster named by KUBECONFIG."""
    from kubernetes import client, config

    from local_cluster import ClusterHandle

    kubeconfig = Path(os.environ["KUBECONFIG"])
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    api = client.ApiClient(cfg)
    try:
        nodes = client.CoreV1Api(api).list_node(label_selector="rose.io/gpu-node=true").items
    finally:
        api.close()
    return ClusterHandle(
        kubeconfig=kubeconfig,
        server=cfg.host,
        node_names=sorted(n.metadata.name for n in nodes),
        gpus_per_node=int(os.environ.get("ROSE_E2E_GPUS_PER_NODE", "8")),
        extender_url=os.environ.get("ROSE_E2E_EXTENDER_URL"),
        workdir=Path(os.environ.get("ROSE_E2E_WORKDIR", "/tmp")),
        pools={n.metadata.name: (n.metadata.labels or {}).get("rose.io/gpu-pool", "") for n in nodes},
    )


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    """One real cluster for the whole end-to-end session: 4 KWOK nodes with 2 simulated GPUs,
    2 pools; the rose-scheduler profile calls an extender at a free loopback port
    (``cluster.extender_url``) that the extender's tests start themselves."""
    if os.environ.get("ROSE_USE_KUBECONFIG") == "1" and os.environ.get("KUBECONFIG"):
        yield _existing_cluster()
        return
    from tests.support.cluster_fixtures import session_shaped_cluster

    with session_shaped_cluster(tmp_path_factory.mktemp("cluster")) as handle:
        yield handle


@pytest.fixture
def api(cluster: ClusterHandle) -> Iterator[Any]:
    """A kubernetes ApiClient for the session cluster, closed after the test."""
    a = cluster.api_client()
    yield a
    a.close()
