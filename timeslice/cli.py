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

Secure by default: gRPC is TLS (``--tls-cert``/``--tls-key``, e.g. the Secret ``rose-timeslice-tls``
mounted as files), callers are authenticated by TokenReview, a job must have worker pods of the
group in its namespace, and the server listens on 127.0.0.1 (the Deployment sets the pod IP).
``serve`` refuses to start plaintext or unauthenticated unless told ``--insecure`` (tests, the
benchmark, one process without a cluster). ``rose timeslice certs --out DIR`` writes a CA and a
server certificate for clusters without a certificate manager.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

from rose_common import runner
from rose_common.cli import EnvArgumentParser, boolean, duration, host_port
from timeslice import advise
from timeslice.identity import ReviewCache
from timeslice.members import Members, RequestPriority
from timeslice.metrics import TimesliceMetrics
from timeslice.orchestrator import DelayHandover, Handover, HandoverOutcome, NoopHandover, Orchestrator, Settings
from timeslice.server import Elector, Limits, Tls, grpc_server, http_server
from timeslice.store import MemoryStore, Store

log = logging.getLogger("timeslice")

ENV_PREFIX = "ROSE_TIMESLICE_"


def build_parser() -> argparse.ArgumentParser:
    p = EnvArgumentParser(env_prefix=ENV_PREFIX, prog="rose timeslice", description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the orchestrator (gRPC Acquire / Yield / Renew / Status)")
    s.flag("--listen", default="127.0.0.1:50051", type=host_port,
           help="HOST:PORT of the gRPC service (in a pod: $(POD_IP):50051)")  # fmt: skip
    s.flag("--metrics-listen", default="127.0.0.1:9090", type=host_port,
           help="HOST:PORT of /metrics, /healthz, /readyz (port 0: off)")  # fmt: skip
    s.flag("--tls-cert", default="", help="PEM certificate chain of the gRPC server (re-read when it changes)")
    s.flag("--tls-key", default="", help="PEM private key of --tls-cert")
    s.flag("--insecure", default=False, type=boolean, nargs="?", const=True,
           help="allow plaintext gRPC, --authenticate none and --job-check none (tests, one process; never in a"
                " cluster: bearer tokens would travel in clear and anyone could name any job)")  # fmt: skip
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
    s.flag("--max-waiters", default=256, type=int, help="Acquire calls that may wait per group")
    s.flag("--max-acquires", default=256, type=int, help="Acquire calls in flight in all")
    s.flag("--max-acquires-per-namespace", default=32, type=int, help="Acquire calls in flight per namespace")
    s.flag("--max-hold", default=600.0, type=duration,
           help="the longest one grant lasts, Renew or not (0: no limit); then the next waiter gets it")  # fmt: skip
    s.flag("--job-check", default="pods", choices=["pods", "none"],
           help="pods: a job takes a place only with worker pods of the group in its namespace, at their"
                " spec.priority (PriorityClass); none: any name, at the request's priority (--insecure)")  # fmt: skip
    s.flag("--max-priority", default=100, type=int,
           help="a job's priority is clamped to +- this many --aging periods of waiting")  # fmt: skip
    s.flag("--switch-timeout", default=60.0, type=duration, help="the longest a hand-over may take")
    s.flag("--leader-elect", default=True, type=boolean, help="hold a coordination.k8s.io Lease before granting")
    s.flag("--lease-name", default="rose-timeslice", help="name of the leader Lease")
    s.flag("--lease-duration", default=15, type=int, help="seconds the leader Lease lasts without renewal")
    s.flag("--lease-renew", default=5.0, type=duration, help="seconds between leader Lease renewals")
    s.flag("--identity", default="", help="this replica's identity (default: hostname-pid)")
    s.flag("--authenticate", default="tokenreview", choices=["none", "tokenreview"],
           help="tokenreview: callers send their ServiceAccount token; a job must be in its namespace"
                " (none needs --insecure)")  # fmt: skip
    s.flag("--token-audience", default="", help="audience the callers' projected tokens carry (empty: the API's)")
    s.flag("--log-level", default="info", help="debug, info, warning or error")
    c = sub.add_parser("certs", help="write a CA and a server certificate for the orchestrator's TLS")
    c.add_argument("--out", required=True, type=Path, help="folder for ca.crt, tls.crt and tls.key")
    c.add_argument("--host", action="append", default=[],
                   help="a DNS name or IP the certificate is for (repeat; default: localhost, 127.0.0.1 and the"
                        " rose-timeslice Service in rose-system)")  # fmt: skip
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


def _settings(args: argparse.Namespace) -> tuple[Settings, Limits]:
    try:
        return (Settings(lease_ttl_s=args.lease_ttl, aging_s=args.aging, max_waiters=args.max_waiters,
                         switch_timeout_s=args.switch_timeout, orphan_grace_s=args.lease_ttl, max_hold_s=args.max_hold),
                Limits(args.max_acquires, args.max_acquires_per_namespace, args.max_priority))  # fmt: skip
    except ValueError as e:
        raise SystemExit(f"rose timeslice serve: {e}") from None


def _refuse_insecure(args: argparse.Namespace) -> Tls | None:
    """The TLS files; SystemExit naming the fix for a plaintext, unauthenticated or unchecked server
    that was not asked for with --insecure."""
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("rose timeslice serve: pass both --tls-cert and --tls-key (or neither, with --insecure)")
    problems = []
    if not args.tls_cert:
        problems.append("no TLS certificate (--tls-cert/--tls-key: callers' bearer tokens would travel in clear)")
    if args.authenticate == "none":
        problems.append("--authenticate none (any caller could name any job)")
    if args.job_check == "none":
        problems.append("--job-check none (any name takes a place, at the priority it asks for)")
    if args.store == "memory" and args.authenticate != "none":
        raise SystemExit("rose timeslice serve: --authenticate tokenreview needs --store kubernetes (for one"
                         " process without a cluster: --authenticate none --job-check none --insecure)")  # fmt: skip
    if problems and not args.insecure:
        raise SystemExit(f"rose timeslice serve: refusing to start with {'; '.join(problems)}. Fix that, or pass"
                         " --insecure for a test server")  # fmt: skip
    for p in problems:
        log.warning("insecure orchestrator (--insecure)", extra={"problem": p})
    return Tls(Path(args.tls_cert), Path(args.tls_key)) if args.tls_cert else None


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


def serve(args: argparse.Namespace, r: runner.Runner) -> int:
    settings, limits = _settings(args)
    tls = _refuse_insecure(args)
    members: Members
    identity = args.identity or f"{socket.gethostname()}-{os.getpid()}"
    store: Store
    if args.store == "kubernetes":
        from rose_common.kube.client import Raw
        from timeslice import kube  # the API-server module, imported only when running against one

        raw = Raw(runner.kube_client(args.kubeconfig, env=f"{ENV_PREFIX}KUBECONFIG"))
        store = kube.LeaseStore(raw, args.namespace)
        lock = kube.LeaseLock(raw, args.namespace, args.lease_name) if args.leader_elect else None
        audiences = [args.token_audience] if args.token_audience else []
        auth = ReviewCache(kube.TokenReviewer(raw, audiences), time.monotonic) if args.authenticate != "none" else None
        members = kube.PodMembers(raw) if args.job_check == "pods" else RequestPriority()
    else:
        if args.job_check != "none":
            raise SystemExit("rose timeslice serve: --job-check pods needs --store kubernetes (or --job-check none"
                             " --insecure)")  # fmt: skip
        store, lock, auth, members = MemoryStore(args.namespace), None, None, RequestPriority()
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
    r.thread(elector.run, "ts-leader")
    host, port = args.listen
    try:
        server, bound = grpc_server(orch, f"{host}:{port}", None, auth, members, limits, tls)
    except OSError as e:
        raise SystemExit(f"rose timeslice serve: {e}") from None
    mhost, mport = args.metrics_listen
    http = http_server(orch, (mhost, mport)) if mport else None
    log.info("timeslice orchestrator running", extra={"identity": identity, "port": bound, "store": args.store,
                                                      "leaderElect": lock is not None, "tls": tls is not None,
                                                      "authenticate": args.authenticate,
                                                      "jobCheck": args.job_check})  # fmt: skip
    print(f"timeslice: listening on {host}:{bound}", flush=True)
    r.stop.wait()
    server.stop(grace=2).wait()
    if http is not None:
        http.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return runner.run("rose timeslice serve", lambda: args, serve)
    if args.command == "advise":
        return advise_cmd(args)
    if args.command == "certs":
        from timeslice import certs

        files = certs.generate(args.out, tuple(args.host) or certs.DEFAULT_HOSTS)
        print(f"CA {files.ca}, certificate {files.cert}, key {files.key}")
        return 0
    raise SystemExit(f"rose timeslice: unknown command {args.command!r}")
