"""`rose demo`: ROSE's story on a real local Kubernetes, on an embedded default.

Act 1 brings up the local cluster (real etcd, kube-apiserver, kube-controller-manager, two
kube-schedulers, KWOK nodes with simulated GPUs) and shows the nodes and their GPUs as a
table. Act 2 forecasts serving demand per pool with the predictor's model (from a fixed origin
of the generated history, so the act is the same at any hour) and lets the real kube-scheduler,
through the ROSE extender, place an RL job's workers in the pool forecast to leave the most
room. Act 3 runs the DRA driver and a real training process (TRL's GRPOTrainer on a tiny LLM):
a serving pod takes the GPU back, waiting in the scheduler's PreBind while the RL job is suspended
into host memory (not evicted); it resumes bit-exact; then a hostile occupant that claims to be
suspended while it keeps its device memory is stopped by the driver's enforcement before serving
is bound; and with host memory full, suspended state spills to a disk tier and comes back
bit-exact (``rose_cli/demo_spill.py``). Act 4
applies an ElasticRLJob with kubectl: the real controller grows it on an idle forecast, shrinks
it to its minimum and then suspends the gang (through real drivers) when serving is forecast to
need the GPUs, and resumes and regrows it when the forecast falls; last, a job of two 0.5 GPU
shares on one GPU, where serving's fraction arrives and the driver suspends one share first. Act 5 runs two small CPU RL
jobs sharing one time-slice group through the orchestrator (a process over the cluster's Leases,
switching through a real driver) and prints the group's duty cycle with and without sharing and
the switch latency split (``rose_cli/demo_timeslice.py``). Act 6 runs example 02 (GRPO on a tiny LLM)
as an ElasticRLJob with roles: rollout workers added and removed as the forecast moves, the trainer
suspended through a real driver and resumed; prompts lost / duplicated, the reward, and whether the
weights are bit-identical to a constant-world run; a PNG of the reward and the lending timeline
(``rose_cli/demo_rollouts.py``). ``--acts 1,6`` runs only those acts (act 1, the cluster, always runs).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rose_common import names, slices
from rose_common.cli import EnvArgumentParser

if TYPE_CHECKING:
    from local_cluster import ClusterHandle

ACTS = (1, 2, 3, 4, 5, 6)


def parse_acts(text: str) -> frozenset[int]:
    """``--acts``: a comma-separated list of act numbers (pure); act 1 (the cluster) is always in."""
    try:
        got = {int(a) for a in text.split(",") if a.strip()}
    except ValueError:
        raise ValueError(f"--acts: a comma-separated list of act numbers {ACTS[0]}-{ACTS[-1]}, got {text!r}") from None
    if not got <= set(ACTS):
        raise ValueError(f"--acts: no act {sorted(got - set(ACTS))}; the acts are {ACTS[0]}-{ACTS[-1]}")
    return frozenset(got | {1})


def _say(msg: str) -> None:
    print(msg, flush=True)


def gpu_table(api: Any) -> list[dict[str, Any]]:
    """Nodes and their GPUs, from the ResourceSlices and Nodes in the API."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    per_node: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"gpus": set(), "serving": 0, "lendable": 0, "model": "-", "memory": 0}
    )
    for s in custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]:
        spec = s["spec"]
        if spec.get("driver") != names.DRIVER_NAME:
            continue
        row = per_node[spec.get("nodeName", "-")]
        for d in spec.get("devices", []):
            _, role = slices.parse_device_name(d["name"])
            attrs = d.get("attributes", {})
            row[role] += 1
            row["gpus"].add(attrs.get(names.ATTR_PHYSICAL_GPU, {}).get("string"))
            row["model"] = attrs.get(names.ATTR_MODEL, {}).get("string", "-")
            row["memory"] = int(d.get("capacity", {}).get(names.CAPACITY_MEMORY, {}).get("value", "0"))
    out = []
    for n in core.list_node().items:
        ready = any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
        row = per_node.get(n.metadata.name, per_node[n.metadata.name])
        out.append(
            {
                "node": n.metadata.name,
                "pool": (n.metadata.labels or {}).get(names.LABEL_POOL, "-"),
                "ready": ready,
                "gpus": len(row["gpus"]),
                "serving": row["serving"],
                "lendable": row["lendable"],
                "model": row["model"],
                "memory_gib": row["memory"] / 1024**3,
            }
        )
    return sorted(out, key=lambda r: r["node"])


def format_table(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'NODE':<14}{'POOL':<9}{'READY':<7}{'GPUS':>5}{'SERVING':>9}{'LENDABLE':>10}  {'MODEL':<26}{'MEM/GPU':>9}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['node']:<14}{r['pool']:<9}{'yes' if r['ready'] else 'NO':<7}{r['gpus']:>5}{r['serving']:>9}"
            f"{r['lendable']:>10}  {r['model']:<26}{r['memory_gib']:>7.0f}Gi"
        )
    total = sum(r["gpus"] for r in rows)
    lines.append(f"{len(rows)} nodes, {total} physical GPUs, each published as a serving and a lendable device")
    return "\n".join(lines)


TITLES = {
    2: "lend by forecast: RL workers go where serving is forecast to leave the most room",
    3: "serving wins: the RL job is suspended into host memory, not evicted; a hostile one is stopped",
    4: "an ElasticRLJob grows on idle GPUs and gives them back before serving needs them",
    5: "two RL jobs share one time-slice group (acquire / yield): duty cycle with and without",
    6: "GRPO with elastic rollout workers (example 02): lent, taken back, nothing lost",
}


def _run_acts(h: ClusterHandle, acts: frozenset[int], figure: Path | None) -> bool:
    """Acts 2-6 (those in ``acts``) on the running cluster; True when every act's checks held."""
    from rose_cli.demo_elastic import act_elastic_job
    from rose_cli.demo_node import act_serving_wins
    from rose_cli.demo_placement import act_lend_by_forecast
    from rose_cli.demo_rollouts import act_rollouts
    from rose_cli.demo_spill import act_spill
    from rose_cli.demo_timeslice import act_timeslice

    def act_serving_wins_and_spill(h: ClusterHandle, api: Any, say: Callable[[str], None]) -> bool:
        ok = act_serving_wins(h, api, say)
        say("   and when host memory is full, suspended state spills to a disk tier instead of being evicted:")
        return act_spill(h, api, say) and ok

    run: dict[int, Callable[[ClusterHandle, Any, Callable[[str], None]], bool]] = {
        2: act_lend_by_forecast,
        3: act_serving_wins_and_spill,
        4: act_elastic_job,
        5: act_timeslice,
        6: lambda h, api, say: act_rollouts(h, api, say, figure),
    }
    ok = True
    api = h.api_client()
    try:
        for n in sorted(acts - {1}):
            _say(f"\nAct {n}: {TITLES[n]}")
            ok &= bool(run[n](h, api, _say))
    finally:
        api.close()
    return ok


def main(argv: list[str] | None = None) -> int:
    from local_cluster import ClusterConfig, ClusterError, LocalCluster, default_workdir, reserved_port

    p = EnvArgumentParser(prog="rose demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=int(os.environ.get("ROSE_DEMO_NODES", "4")))
    p.add_argument("--gpus-per-node", type=int, default=int(os.environ.get("ROSE_DEMO_GPUS_PER_NODE", "8")))
    p.add_argument("--dir", type=Path, default=default_workdir("demo"), help="cluster work directory")
    p.add_argument("--keep", action="store_true", help="leave the cluster running at the end")
    p.add_argument(
        "--acts",
        default=os.environ.get("ROSE_DEMO_ACTS", ",".join(map(str, ACTS))),
        help="the acts to run, comma-separated (act 1 always runs), e.g. 1,6",
    )
    p.add_argument(
        "--figure",
        type=Path,
        default=None,
        help="act 6's PNG (reward and lending timeline); default: in the act's work dir",
    )
    args = p.parse_args(argv)
    try:
        acts = parse_acts(args.acts)
    except ValueError as e:
        p.error(str(e))

    t0 = time.monotonic()
    _say("== ROSE demo: lend idle serving GPUs to RL, suspend instead of evict ==\n")
    _say("Act 1: a real Kubernetes control plane on loopback, KWOK nodes with simulated GPUs")
    cfg = ClusterConfig(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        workdir=args.dir,
        pools=2,
        # the demo starts its own extender (act 2): any free port, so it never clashes with
        # another cluster's extender on the default one
        extender_url=f"http://127.0.0.1:{reserved_port()}",
        # a demo killed mid-way leaves no cluster behind, unless asked to keep it
        die_with_parent=not args.keep,
    )
    lc = LocalCluster(cfg, progress=lambda m: _say(f"   · {m}"))
    lc.down()  # a previous demo left running
    try:
        h = lc.up()
    except ClusterError as e:
        print(f"rose demo: error: {e}", file=sys.stderr)
        return 1
    try:
        api = h.api_client()
        try:
            _say("")
            _say(format_table(gpu_table(api)))
        finally:
            api.close()
        ok = _run_acts(h, acts, args.figure)
        _say(f"\nexport KUBECONFIG={h.kubeconfig}   # to look around with kubectl")
    finally:
        if not args.keep:
            _say("\nstopping the cluster (rose demo --keep leaves it running)")
            lc.down()
    _say(f"demo finished in {time.monotonic() - t0:.0f}s")
    return 0 if ok else 1
