"""``rose timeslice serve|advise`` / ``python -m timeslice``: run the orchestrator; judge whether slicing pays.

Every flag can also be set with an environment variable ``ROSE_TIMESLICE_<FLAG>`` (upper case,
dashes as underscores), e.g. ``ROSE_TIMESLICE_LEASE_TTL=10s``; the command line wins.

I/O boundary: argument parsing, then the servers of :mod:`timeslice.server` until SIGTERM.
``--store kubernetes`` keeps each group's record in a Lease of ``--namespace`` and elects one
active replica; ``--store memory`` (explicit; one process, no Kubernetes) keeps it in memory.
``--handover noop`` moves no device state (CPU jobs, tests, the benchmark); ``--handover delay``
moves none either but takes ``--handover-delay`` (a hand-over in flight, for crash tests);
``--handover kube`` suspends and restores the jobs' workers on every node of the group through
their DRA drivers, all or nothing (:mod:`timeslice.handover`; needs ``--store kubernetes``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from rose_common import logs
from rose_common.cli import EnvArgumentParser, boolean, duration, host_port
from timeslice import advise
from timeslice.identity import ReviewCache
from timeslice.metrics import TimesliceMetrics
from timeslice.orchestrator import DelayHandover, Handover, HandoverOutcome, NoopHandover, Orchestrator, Settings
from timeslice.server import Elector, grpc_server, http_server
from timeslice.store import MemoryStore, Store

log = logging.getLogger("timeslice")

ENV_PREFIX = "ROSE_TIMESLICE_"


def build_parser() -> argparse.ArgumentParser:
    p = EnvArgumentParser(env_prefix=ENV_PREFIX, prog="rose timeslice", description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the orchestrator (gRPC Acquire / Yield / Renew / Status)")
    s.flag("--listen", default="0.0.0.0:50051", type=host_port, help="HOST:PORT of the gRPC service")
    s.flag("--metrics-listen", default="0.0.0.0:9090", type=host_port,
           help="HOST:PORT of /metrics, /healthz, /readyz (port 0: off)")  # fmt: skip
    s.flag("--store", default="kubernetes", choices=["kubernetes", "memory"],
           help="where group records live: a Lease per group, or process memory (one replica, no cluster)")  # fmt: skip
    s.flag("--kubeconfig", default="", help="kubeconfig file; empty = in-cluster service account")
    s.flag("--namespace", default=os.environ.get("POD_NAMESPACE", "rose-system"),
           help="namespace of the group and leader Leases (default: $POD_NAMESPACE, else rose-system)")  # fmt: skip
    s.flag("--handover", default="noop", choices=["noop", "delay", "kube"],
           help="how device state moves (noop: nothing moves; delay: nothing moves in --handover-delay;"
                " kube: through the group's nodes' drivers, all or nothing)")  # fmt: skip
    s.flag("--handover-delay", default=0.0, type=duration, help="seconds a 'delay' hand-over takes")
    s.flag("--lease-ttl", default=10.0, type=duration, help="a holder's lease without Renew or Yield")
    s.flag("--aging", default=10.0, type=duration, help="seconds of waiting worth one priority level")
    s.flag("--max-waiters", default=256, type=int, help="Acquire calls that may wait per group (and in all)")
    s.flag("--switch-timeout", default=60.0, type=duration, help="the longest a hand-over may take")
    s.flag("--leader-elect", default=True, type=boolean, help="hold a coordination.k8s.io Lease before granting")
    s.flag("--lease-name", default="rose-timeslice", help="name of the leader Lease")
    s.flag("--lease-duration", default=15, type=int, help="seconds the leader Lease lasts without renewal")
    s.flag("--lease-renew", default=5.0, type=duration, help="seconds between leader Lease renewals")
    s.flag("--identity", default="", help="this replica's identity (default: hostname-pid)")
    s.flag("--authenticate", default="none", choices=["none", "tokenreview"],
           help="tokenreview: callers send their ServiceAccount token; a job must be in its namespace")  # fmt: skip
    s.flag("--token-audience", default="", help="audience the callers' projected tokens carry (empty: the API's)")
    s.flag("--log-level", default="info", help="debug, info, warning or error")
    a = sub.add_parser("advise", help="whether time-slicing pays for some jobs' phase timings")
    a.add_argument("timings", type=Path, help="CSV (header job,gpu_s,off_s; a row per cycle) or JSON list of rows")
    a.flag("--switch-cost", required=True, type=duration,
           help="one switch: suspend + restore + grant overhead (e.g. from benchmarks.gpu_suspend)")  # fmt: skip
    a.flag("--min-gain", default=1.2, type=float, help="shared duty cycle needed over the best solo one")
    a.add_argument("--json", action="store_true", help="print the advice as JSON")
    return p


def advise_cmd(args: argparse.Namespace) -> int:
    """Exit 0 when time-slicing pays, 1 when it does not, 2 on unreadable input."""
    try:
        advice = advise.advise(advise.load(args.timings), args.switch_cost, args.min_gain)
    except (OSError, ValueError) as e:
        print(f"rose timeslice advise: {e}", file=sys.stderr)
        return 2
    print(json.dumps(dataclasses.asdict(advice), indent=2) if args.json else advise.render(advice))
    return 0 if advice.pays else 1


def _settings(args: argparse.Namespace) -> Settings:
    try:
        return Settings(lease_ttl_s=args.lease_ttl, aging_s=args.aging, max_waiters=args.max_waiters,
                        switch_timeout_s=args.switch_timeout, orphan_grace_s=args.lease_ttl)  # fmt: skip
    except ValueError as e:
        raise SystemExit(f"rose timeslice serve: {e}") from None


class _PerSwitch:
    """A fresh ``KubeHandover`` per switch: it keeps watch state, and groups switch concurrently."""

    def __init__(self, raw: object, rollback_timeout_s: float) -> None:
        self.raw = raw
        self.rollback_timeout_s = rollback_timeout_s

    def switch(self, group: str, token: int, out_job: str | None, in_job: str, deadline: float) -> HandoverOutcome:
        from timeslice.handover import KubeHandover, RawPods

        return KubeHandover(RawPods(self.raw), rollback_timeout_s=self.rollback_timeout_s).switch(
            group, token, out_job, in_job, deadline
        )


def _handover(args: argparse.Namespace, raw: object | None) -> Handover:
    if args.handover == "kube":
        if raw is None:
            raise SystemExit("rose timeslice serve: --handover kube needs --store kubernetes (it patches pods)")
        return _PerSwitch(raw, args.switch_timeout)
    return DelayHandover(args.handover_delay) if args.handover == "delay" else NoopHandover()


def serve(args: argparse.Namespace) -> int:
    logs.setup(args.log_level)
    settings = _settings(args)
    identity = args.identity or f"{socket.gethostname()}-{os.getpid()}"
    store: Store
    if args.store == "kubernetes":
        from rose_common.kube.client import Raw, api_client
        from timeslice import kube  # the API-server module, imported only when running against one

        raw = Raw(api_client(Path(args.kubeconfig) if args.kubeconfig else None))
        store = kube.LeaseStore(raw, args.namespace)
        lock = kube.LeaseLock(raw, args.namespace, args.lease_name) if args.leader_elect else None
        audiences = [args.token_audience] if args.token_audience else []
        auth = ReviewCache(kube.TokenReviewer(raw, audiences), time.monotonic) if args.authenticate != "none" else None
    else:
        if args.authenticate != "none":
            raise SystemExit("rose timeslice serve: --authenticate tokenreview needs --store kubernetes")
        store, lock, auth = MemoryStore(args.namespace), None, None
    metrics = TimesliceMetrics()
    holder: list[Orchestrator] = []

    def on_change(lead: bool) -> None:
        metrics.leader.set(1 if lead else 0)
        if not lead and holder:
            holder[0].drop()

    try:
        elector = Elector(lock, identity, args.lease_duration, args.lease_renew, on_change)
    except ValueError as e:
        raise SystemExit(f"rose timeslice serve: {e}") from None
    handover = _handover(args, raw if args.store == "kubernetes" else None)
    orch = Orchestrator(store, handover, metrics, settings, leading=elector.leading)
    holder.append(orch)
    metrics.leader.set(1 if elector.leading() else 0)
    stop = threading.Event()
    threading.Thread(target=elector.run, args=(stop,), name="ts-leader", daemon=True).start()
    host, port = args.listen
    server, bound = grpc_server(orch, f"{host}:{port}", settings.max_waiters + 16, auth)
    mhost, mport = args.metrics_listen
    http = http_server(orch, (mhost, mport)) if mport else None

    def _term(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    log.info("timeslice orchestrator running", extra={"identity": identity, "port": bound, "store": args.store,
                                                      "leaderElect": lock is not None})  # fmt: skip
    print(f"timeslice: listening on {host}:{bound}", flush=True)
    stop.wait()
    server.stop(grace=2).wait()
    if http is not None:
        http.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    if args.command == "advise":
        return advise_cmd(args)
    raise SystemExit(f"rose timeslice: unknown command {args.command!r}")
