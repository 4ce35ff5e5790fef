"""Demo act 5 on the session cluster: ``rose timeslice serve`` as a process over the real API
server (Leases, leader election, ``--handover kube``), one real driver on a KWOK node, two CPU
REINFORCE jobs as separate processes sharing one group through the SDK client. The act must
succeed (sharing raises the duty cycle, a driver ``Suspended`` Event per switch) and print the
switch split; afterwards the node gets the session cluster's seed slices back.
"""

from __future__ import annotations

from typing import Any

from driver_fixtures import restore_seed_slices

from local_cluster import ClusterHandle
from rose_cli.demo_timeslice import act_timeslice, pick_node


def test_act_5_two_jobs_share_a_group_through_the_driver(cluster: ClusterHandle, api: Any) -> None:
    lines: list[str] = []
    try:
        ok = act_timeslice(cluster, api, lines.append)
    finally:
        restore_seed_slices(cluster, api, [pick_node(cluster.node_names, cluster.pools)])
    out = "\n".join(lines)
    assert ok, out
    assert "leader elected, hand-over through the driver" in out, out
    assert "switches through the driver, p50 / p95: suspend" in out, out
    assert "group duty cycle: solo" in out, out
