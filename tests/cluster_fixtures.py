"""A cluster of its own for an end-to-end module whose scenario changes cluster state that the
session cluster's later tests read (drivers' ResourceSlices, an extender behind the
rose-scheduler profile, forecasts): the same shape as the session cluster (tests/conftest.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from local_cluster import ClusterConfig, ClusterHandle, LocalCluster, free_port


@contextlib.contextmanager
def session_shaped_cluster(workdir: Path) -> Iterator[ClusterHandle]:
    """4 KWOK nodes with 2 simulated GPUs, 2 pools, an extender URL at a free port; down at the end."""
    cfg = ClusterConfig(nodes=4, gpus_per_node=2, pools=2, workdir=workdir,
                        extender_url=f"http://127.0.0.1:{free_port()}", die_with_parent=True)  # fmt: skip
    lc = LocalCluster(cfg)
    handle = lc.up()
    try:
        yield handle
    finally:
        lc.down()
