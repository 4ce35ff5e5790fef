"""A cluster of its own for an end-to-end module whose scenario changes cluster state that the
session cluster's later tests read (drivers' ResourceSlices, an extender behind the
rose-scheduler profile, forecasts, cluster-wide admission policies): by default the same shape as
the session cluster (tests/conftest.py), which is built here too.

I/O: a real local control plane (``local_cluster``) under ``workdir``, torn down on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from local_cluster import ClusterConfig, ClusterHandle, LocalCluster, reserved_port


@contextlib.contextmanager
def session_shaped_cluster(workdir: Path, *, nodes: int = 4, extender: bool = True) -> Iterator[ClusterHandle]:
    """``nodes`` KWOK nodes with 2 simulated GPUs over 2 pools and, with ``extender``, an extender
    URL at a reserved port (the rose-scheduler profile; see :func:`local_cluster.reserved_port`); down at the end."""
    extender_url = f"http://127.0.0.1:{reserved_port()}" if extender else None
    cfg = ClusterConfig(
        nodes=nodes, gpus_per_node=2, pools=2, workdir=workdir, extender_url=extender_url, die_with_parent=True
    )
    lc = LocalCluster(cfg)
    handle = lc.up()
    try:
        yield handle
    finally:
        lc.down()
