"""Sim-to-real (issue 24): a short time-compressed slice of the real ServeGen trace through the
real controller, extender and drivers on the session cluster (static oracle forecast file) and
through ``rose_sim``'s engine with the same inputs; they must agree within
``benchmarks.sim_to_real.TOLERANCE`` (justified in docs/bench/sim-to-real.md).

2 simulated hours at 120x: 12 rows of 5 s (60 s played, plus the components' start-up). The
slice holds grows on both pools and a planned reclaim ahead of a serving rise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.sim_to_real import markdown, run
from local_cluster import ClusterHandle
from tests.conftest import traces_dir
from tests.support.driver_fixtures import restore_seed_slices


def test_real_system_and_simulator_agree_on_a_short_slice(cluster: ClusterHandle, api: Any, tmp_path: Path) -> None:
    series = traces_dir() / "derived" / "servegen_m-large_10min.csv"
    try:
        r = run(series, hours=2, speed=120, workdir=tmp_path / "s2r", cluster=cluster, say=print)
    finally:
        # its drivers removed their slices on shutdown: give the session cluster's nodes their seed
        # slices back (the next tests schedule on them, and test_driver_e2e expects a driver to
        # publish above the seed's generation)
        restore_seed_slices(cluster, api, list(cluster.node_names))
    (tmp_path / "s2r.json").write_text(json.dumps(r, indent=1))
    why = markdown(r["comparison"]) + "\n".join(r["real"]["events"] + r["real"]["placements"])
    assert r["ok"], why
    # the slice exercised the planner on both sides, not only an idle fleet
    assert r["sim"]["grows"] >= 4 and r["sim"]["planned_reclaims"] >= 1, why
    assert r["real"]["grows"] >= 4 and r["real"]["planned_reclaims"] >= 1, why
