"""How long ``LocalCluster.down()`` takes: the teardown every e2e cluster fixture pays (docs/bench/ci-time.md).

    python -m benchmarks.cluster_down --rounds 2
    PYTHONPATH=/other/checkout python benchmarks/cluster_down.py   # another checkout's local_cluster

Brings up the session-shaped cluster (4 KWOK nodes, 2 GPUs each, 2 pools, an extender URL), waits
``--settle`` seconds, times ``down()``; prints one line per round and the components stopped.

I/O: real local control planes under a temporary directory, removed after each round.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from local_cluster import ClusterConfig, LocalCluster, free_port


def one_round(nodes: int, settle: float) -> tuple[float, float, list[str]]:
    """(seconds up, seconds down, components stopped) of one cluster."""
    wd = Path(tempfile.mkdtemp(prefix="rose-cluster-down-"))
    try:
        url = f"http://127.0.0.1:{free_port()}"
        cfg = ClusterConfig(nodes=nodes, gpus_per_node=2, pools=2, workdir=wd, extender_url=url, die_with_parent=True)
        lc = LocalCluster(cfg)
        t0 = time.monotonic()
        lc.up()
        up_s = time.monotonic() - t0
        time.sleep(settle)
        t0 = time.monotonic()
        stopped = lc.down()
        return up_s, time.monotonic() - t0, stopped
    finally:
        shutil.rmtree(wd, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds between up and down")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.nodes < 1:
        ap.exit(2, "cluster_down: error: --rounds and --nodes must be >= 1\n")
    for i in range(a.rounds):
        up_s, down_s, stopped = one_round(a.nodes, a.settle)
        print(f"round {i + 1}: up {up_s:.1f} s, down {down_s:.2f} s, stopped {','.join(stopped)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
