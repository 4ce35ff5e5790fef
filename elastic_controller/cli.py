"""``rose controller`` / ``python -m elastic_controller``: run the ElasticRLJob controller.

Every flag can also be set with an environment variable ``ROSE_CONTROLLER_<FLAG>`` (upper case,
dashes as underscores), e.g. ``ROSE_CONTROLLER_FORECAST_FILE=/etc/rose/forecasts.json``; the
command line wins.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket

from elastic_controller import pools
from elastic_controller.controller import Controller, ControllerSettings
from elastic_controller.metrics import ControllerMetrics
from elastic_controller.planner import Forecast
from rose_common import forecast_client, httpserver, runner
from rose_common.cli import EnvArgumentParser, boolean, duration, host_port
from rose_common.forecast_client import ForecastCache, ForecastError, StaticFileForecastSource, make_source
from rose_common.informer import FunctionHandler, Listed
from rose_common.workqueue import start_workers

log = logging.getLogger("elastic_controller")

ENV_PREFIX = "ROSE_CONTROLLER_"


def build_parser() -> argparse.ArgumentParser:
    p = EnvArgumentParser(
        env_prefix=ENV_PREFIX,
        prog="rose controller",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.flag("--kubeconfig", default="", help="kubeconfig file; empty = in-cluster service account")
    p.flag("--metrics-listen", default="0.0.0.0:9090", type=host_port, help="HOST:PORT of /metrics (port 0: off)")
    forecast_client.add_flags(p, without="pools lend nothing")
    p.flag("--quantile", default="0.9", help="forecast quantile treated as what serving may need")
    p.flag("--plan-interval", default=10.0, type=duration, help="seconds between plans over all jobs")
    p.flag("--dwell", default=300.0, type=duration, help="seconds a job that shrank waits before it may grow again")
    p.flag(
        "--planner",
        default="on",
        choices=["on", "off"],
        help="off: reactive only, no planned reclaims (serving waits for the suspend on arrival)",
    )
    p.flag("--workers", default=16, type=int, help="reconcile worker threads (one key is never on two at once)")
    p.flag(
        "--write-concurrency",
        default=8,
        type=int,
        help="API writes of a reconcile (suspend requests, pods, world annotations) in flight together, "
        "over all workers",
    )
    p.flag("--leader-elect", default=True, type=boolean, help="hold a coordination.k8s.io Lease before acting")
    p.flag(
        "--lease-namespace",
        default=os.environ.get("POD_NAMESPACE", "rose-system"),
        help="namespace of the leader Lease (default: $POD_NAMESPACE, else rose-system)",
    )
    p.flag("--lease-name", default="rose-elastic-controller", help="name of the leader Lease")
    p.flag("--lease-duration", default=15, type=int, help="seconds a lease lasts without renewal")
    p.flag("--lease-renew", default=5.0, type=duration, help="seconds between lease renewals")
    p.flag("--identity", default="", help="this replica's lease identity (default: hostname-pid)")
    p.flag(
        "--taint-lead",
        default=60.0,
        type=float,
        help="seconds ahead a pool's forecast must leave a GPU to lend, else its lendable devices get the "
        "rose.io/reclaim-planned NoSchedule DeviceTaintRules (with the occupants' own reclaim lead); "
        "< 0: no taints",
    )
    p.flag(
        "--schedule-retry",
        default=15.0,
        type=duration,
        help="seconds a worker pod may stay Unschedulable before the controller nudges kube-scheduler to "
        "try it again (an extender's refusal on a forecast since changed is not a cluster event)",
    )
    p.flag(
        "--refused-after",
        default=60.0,
        type=duration,
        help="seconds a granted worker may stay Unschedulable with the ROSE extender's serving-forecast "
        "refusal before the planner removes it as not fitting (the two fetch the predictor apart)",
    )
    p.flag(
        "--refused-cooldown",
        default=300.0,
        type=duration,
        help="seconds a job gets no new worker in a pool after one was removed there by --refused-after",
    )
    p.flag("--log-level", default="info", help="debug, info, warning or error")
    return p


def _forecasts(args: argparse.Namespace, metrics: ControllerMetrics) -> ForecastCache[Forecast] | None:
    try:
        source = make_source(
            args.forecast_backend,
            url=args.predictor_url,
            path=args.forecast_file,
            timeout_s=args.forecast_timeout,
            horizons=args.forecast_horizons,
        )
    except ValueError as e:
        raise SystemExit(
            f"rose controller: {e}: set --predictor-url / --forecast-file "
            f"(or {ENV_PREFIX}PREDICTOR_URL / {ENV_PREFIX}FORECAST_FILE)"
        ) from None
    if source is None:
        return None
    if isinstance(source, StaticFileForecastSource):
        try:  # a missing or malformed file is refused at start
            source.check()
        except ForecastError as e:
            raise SystemExit(f"rose controller: --forecast-file: {' '.join(str(e).split())}") from None
    quantile, risk = args.quantile, args.risk
    return ForecastCache(
        source,
        reduce=lambda r: metrics.on_forecast(pools.to_forecast(r, quantile, risk=risk)),
        refresh_s=args.forecast_refresh,
        max_age_s=args.forecast_max_age,
        on_fetch=metrics.on_forecast_fetch,
    )


class _NoForecasts:
    def get(self, pool: str) -> Forecast | None:
        return None


def settings_from(args: argparse.Namespace) -> ControllerSettings:
    try:
        return ControllerSettings(
            plan_interval_s=args.plan_interval,
            dwell_s=args.dwell,
            identity=args.identity or f"{socket.gethostname()}-{os.getpid()}",
            lease_duration_s=args.lease_duration,
            lease_renew_s=args.lease_renew,
            planned=args.planner == "on",
            write_concurrency=args.write_concurrency,
            taint_lead_s=args.taint_lead,
            schedule_retry_s=args.schedule_retry,
            refused_after_s=args.refused_after,
            refused_cooldown_s=args.refused_cooldown,
        )
    except ValueError as e:
        raise SystemExit(f"rose controller: {e}") from None


def main(argv: list[str] | None = None) -> int:
    return runner.run("rose controller", lambda: build_parser().parse_args(argv), serve)


def serve(args: argparse.Namespace, r: runner.Runner) -> int:
    for flag, value in (("--workers", args.workers), ("--write-concurrency", args.write_concurrency)):
        if value < 1:
            raise SystemExit(f"rose controller: {flag} must be >= 1, got {value}")
    settings = settings_from(args)
    metrics = ControllerMetrics(args.forecast_backend)
    cache = _forecasts(args, metrics)
    from elastic_controller import kube  # the API-server module, imported only when running
    from rose_common.kube.client import Raw

    # one connection per watch (4), reconcile worker, concurrent write, and the Event and lease threads
    connections = 6 + args.workers + args.write_concurrency
    raw = Raw(runner.kube_client(args.kubeconfig, env=f"{ENV_PREFIX}KUBECONFIG", connections=connections))
    lease = kube.LeaseLock(raw, args.lease_namespace, args.lease_name) if args.leader_elect else None
    inventory = kube.InventoryStore()
    ctl = Controller(
        kube.KubeJobApi(raw, host=settings.identity, background_events=True),
        cache or _NoForecasts(),
        inventory,
        metrics,
        settings,
        lease,
    )
    ctl.device_memory = inventory.device_memory
    ctl.share_memory = inventory.smallest_device_memory
    ctl.taint_rules, ctl.lendable_devices = kube.KubeTaintRules(raw), inventory.lendable_devices
    ctl.serving_held, ctl.lent_gpus = inventory.serving_held, inventory.lent_gpus
    ctl.claims = kube.ClaimAllocations(raw).get
    restart = lambda kind: metrics.watch_restarts.labels(kind).inc()  # noqa: E731
    listed = Listed(("ElasticRLJobs", "Pods"))  # readiness: both listed once
    jobs = FunctionHandler(ctl.on_job_event, listed.wrap("ElasticRLJobs", ctl.on_job_list))
    pods = FunctionHandler(ctl.on_pod_event, listed.wrap("Pods", ctl.on_pod_list))
    infs = kube.informers(raw, jobs, pods, restart, ctl.stop)
    infs += kube.inventory_informers(raw, inventory, restart, ctl.stop)
    group_leases = kube.GroupLeases(ctl.on_group_change)  # the time-slice orchestrator's, read only
    ctl.group_lease = group_leases.get
    infs += kube.group_informers(raw, args.lease_namespace, group_leases, restart, ctl.stop)
    host, port = args.metrics_listen
    if port:
        try:
            alive = lambda: (False, "stopping") if ctl.stop.is_set() else (True, "ok")  # noqa: E731
            httpserver.serve_probes(
                (host, port), registry=metrics.registry, name="controller", healthy=alive, ready=listed.ready
            )
        except OSError as err:
            raise SystemExit(f"rose controller: --metrics-listen {host}:{port}: {err.strerror or err}") from None
    if cache is not None:
        cache.start()
    for inf in infs:
        inf.start()
    start_workers(ctl.queue, ctl.reconcile, args.workers)
    r.thread(lambda _: ctl.elect_loop(), "leader")
    r.thread(lambda _: ctl.plan_loop(), "plan")
    r.on_stop(ctl.stop.set)
    log.info(
        "controller running",
        extra={
            "identity": settings.identity,
            "leaderElect": args.leader_elect,
            "forecastBackend": args.forecast_backend,
            "planner": args.planner,
        },
    )
    ctl.stop.wait()
    ctl.queue.shutdown()
    if cache is not None:
        cache.stop()
    return 0
