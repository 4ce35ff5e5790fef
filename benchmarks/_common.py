"""Small helpers the benchmark scripts share: a timestamped progress line, p-quantiles of a
cumulative Prometheus histogram in milliseconds, and the JSON report a ``--json`` flag asks for.

I/O boundary: ``log`` writes to stderr, ``emit_json`` to stdout, ``write_json`` the given file;
``quantiles_ms`` is pure; ``simulated_driver`` and ``own_slice_devices`` start and read a real
``rose driver`` on a local cluster's node.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rose_common import promtext


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def quantiles_ms(
    cumulative: list[tuple[float, float]], qs: Sequence[float] = (0.5, 0.95), digits: int = 1
) -> dict[str, float]:
    """``count`` and ``p<q>_ms`` for each of ``qs`` (linear inside a bucket, as PromQL does)."""
    total = cumulative[-1][1] if cumulative else 0.0
    out: dict[str, float] = {"count": total}
    if total > 0:
        for q in qs:
            out[f"p{int(q * 100)}_ms"] = round(promtext.histogram_quantile(q, cumulative) * 1000, digits)
    return out


def write_json(path: Path | None, report: object, indent: int = 1) -> None:
    """The report as indented JSON at ``path`` (nothing when no path was asked for)."""
    if path is not None:
        path.write_text(json.dumps(report, indent=indent) + "\n")


def emit_json(report: object, path: Path | None, indent: int = 1) -> None:
    """The report as indented JSON on stdout, and at ``path`` when one was asked for."""
    print(json.dumps(report, indent=indent))
    write_json(path, report, indent)


# the flags every single-node benchmark driver shares: the node engine on the explicit simulated
# backend, a host-memory budget that never binds, no node-facts loop and no CPU resize
SIMULATED_DRIVER_FLAGS = (
    "--suspend-engine", "node", "--suspend-backends", "simulated", "--host-memory-budget", "8Gi",
    "--node-facts-seconds", "0", "--suspended-cpu=",
)  # fmt: skip


def simulated_driver(handle: Any, root: Path, *extra: str) -> Any:
    """A real ``rose driver`` for the cluster's first node on the simulated backend (a
    ``local_cluster.kubelet.DriverProcess``), with ``extra`` flags after the shared ones."""
    from local_cluster import free_port
    from local_cluster.kubelet import DriverProcess

    node = handle.node_names[0]
    args = [*SIMULATED_DRIVER_FLAGS, *extra]
    return DriverProcess(handle.kubeconfig, node, root, handle.gpus_per_node, free_port(), extra_args=args)


def own_slice_devices(api: Any, node: str) -> list[dict[str, Any]] | None:
    """The devices of the ResourceSlice the node's driver publishes for its GPUs (the one carrying
    its spec hash), or None while it has not published one."""
    from local_cluster.objects import driver_slices

    for s in driver_slices(api, node):
        if s["metadata"].get("annotations", {}).get("gpu.rose.io/spec-hash"):
            return list(s["spec"]["devices"])
    return None
