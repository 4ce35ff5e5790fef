"""Demo act 5 on a cluster of its own: ``rose timeslice serve`` as a process over the real API
server (Leases, leader election, ``--handover kube``), one real driver on a KWOK node, two CPU
REINFORCE jobs as separate processes sharing one group through the SDK client. The act must
succeed (both jobs granted in turn, a driver ``Suspended`` Event per switch) and print the
switch split. It runs on a cluster of its own: the act relabels pods, publishes a driver's slices
and leaves the group's Leases, which the session cluster's later scenarios must not see.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from local_cluster import ClusterHandle
from rose_cli.demo_timeslice import act_timeslice
from tests.support.cluster_fixtures import session_shaped_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    with session_shaped_cluster(tmp_path_factory.mktemp("timeslice-demo-cluster"), extender=False) as c:
        yield c


def test_act_5_two_jobs_share_a_group_through_the_driver(cluster: ClusterHandle, api: Any) -> None:
    lines: list[str] = []
    ok = act_timeslice(cluster, api, lines.append)
    out = "\n".join(lines)
    assert ok, out
    assert "leader elected, hand-over through the driver" in out, out
    assert "switches through the driver, p50 / p95: suspend" in out, out
    assert "group duty cycle: solo" in out, out
