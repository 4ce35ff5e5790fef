"""`rose cluster up|down|status|env`: the local cluster from the command line.

``status`` exits 0 when every component runs, 1 when one died (its log tail is shown), 3 when
nothing runs (no cluster, or all stopped); ``-o json`` prints the same rows as a JSON list.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from local_cluster.cluster import (
    DEFAULT_EXTENDER_PORT,
    ClusterConfig,
    ClusterError,
    LocalCluster,
    default_workdir,
)
from rose_common.cli import EnvArgumentParser, port_type


def _progress(msg: str) -> None:
    print(f"[rose cluster] {msg}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = EnvArgumentParser(env_prefix="ROSE_CLUSTER_", prog="rose cluster", description=__doc__)
    p.flag("--dir", type=Path, default=default_workdir(), help="cluster work directory: pki, logs, pids, kubeconfig")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start etcd, kube-apiserver, kube-controller-manager, schedulers and KWOK")
    up.flag("--nodes", type=int, default=4, help="KWOK nodes")
    up.flag("--gpus-per-node", type=int, default=8, help="simulated GPUs per node in the seed ResourceSlices")
    up.flag("--pools", type=int, default=1, help="serving pools the nodes are spread over")
    up.flag(
        "--kubernetes-version",
        env="ROSE_K8S_VERSION",
        help="k8s.io/kubernetes version to build and run (default pinned)",
    )
    up.flag("--apiserver-port", type=port_type(0, "0: pick a free one"), default=0, help="kube-apiserver port")
    up.flag("--etcd-port", type=port_type(0, "0: pick a free one"), default=0, help="etcd client port")
    up.flag(
        "--extender-url",
        default=f"http://127.0.0.1:{DEFAULT_EXTENDER_PORT}",
        help="URL the rose-scheduler profile calls the extender at; '' for none",
    )
    up.add_argument(
        "--no-seed-slices",
        action="store_true",
        help="do not publish ResourceSlices (leave it to the DRA driver processes)",
    )
    up.add_argument(
        "--real-node",
        action="store_true",
        help="also start one node run by a real kubelet and containerd (docs/real-node.md)",
    )
    sub.add_parser("down", help="stop every component; leaves no process or port behind")
    st = sub.add_parser("status", help="components, pids, ports; the log tail of any that died")
    st.add_argument("-o", "--output", choices=["text", "json"], default="text", help="output format")
    sub.add_parser("env", help="print `export KUBECONFIG=…` for this cluster")
    return p


STATUS_RUNNING, STATUS_DIED, STATUS_NOTHING_RUNS = 0, 1, 3


def status_code(rows: list[dict[str, Any]]) -> int:
    """1 if a component died, 3 if none runs, else 0."""
    if any(r.get("log_tail") for r in rows):
        return STATUS_DIED
    return STATUS_RUNNING if any(r["alive"] for r in rows) else STATUS_NOTHING_RUNS


def _status(rows: list[dict[str, Any]], output: str) -> int:
    code = status_code(rows)
    if output == "json":
        print(json.dumps(rows, indent=2))
        return code
    for r in rows:
        state = "running" if r["alive"] else ("DIED" if r["pid"] else "not started")
        print(f"{r['component']:<25} {state:<12} pid={r['pid'] or '-':<8} port={r['port'] or '-':<6} {r['log']}")
        if r.get("log_tail"):
            print("    last log lines:\n    " + r["log_tail"].replace("\n", "\n    "))
    if code == STATUS_NOTHING_RUNS:
        print("rose cluster: nothing is running: start it with `rose cluster up`", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    lc = LocalCluster(ClusterConfig(workdir=args.dir), progress=_progress)
    try:
        if args.cmd == "up":
            cfg = ClusterConfig(
                nodes=args.nodes,
                gpus_per_node=args.gpus_per_node,
                pools=args.pools,
                workdir=args.dir,
                kubernetes_version=args.kubernetes_version,
                apiserver_port=args.apiserver_port,
                etcd_port=args.etcd_port,
                extender_url=args.extender_url or None,
                seed_slices=not args.no_seed_slices,
            )
            h = LocalCluster(cfg, progress=_progress).up()
            print(f"cluster up: {len(h.node_names)} nodes, Kubernetes {h.kubernetes_version}, API {h.server}")
            if args.real_node:
                from local_cluster.realnode import RealNode

                secs = RealNode(h, progress=_progress).up()
                print(f"real node up in {secs:.1f}s")
            print(f"export KUBECONFIG={h.kubeconfig}")
        elif args.cmd == "down":
            from local_cluster.realnode import stop_real_node

            stopped = stop_real_node(args.dir) + lc.down()
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        elif args.cmd == "status":
            from local_cluster.realnode import real_node_status

            return _status(lc.status() + real_node_status(args.dir), args.output)
        elif args.cmd == "env":
            print(f"export KUBECONFIG={lc.handle().kubeconfig}")
    except ClusterError as e:
        print(f"rose cluster: error: {e}", file=sys.stderr)
        return 1
    return 0
