"""``rose extender`` / ``python -m scheduler_extender``: run the kube-scheduler HTTP extender.

Every flag can also be set with an environment variable ``ROSE_EXTENDER_<FLAG>`` (upper case,
dashes as underscores), e.g. ``ROSE_EXTENDER_LISTEN=127.0.0.1:18787``; the command line wins.
"""

from __future__ import annotations

import argparse
import logging
import ssl
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from rose_common import forecast_client, runner
from rose_common.cli import EnvArgumentParser, byte_size, duration, host_port
from rose_common.forecast_client import ForecastError, StaticFileForecastSource, make_source
from scheduler_extender import policy
from scheduler_extender.cache import ClusterCache
from scheduler_extender.forecast import ForecastCache
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.server import (
    DEFAULT_MAX_BODY,
    METRICS_ROUTES,
    VERB_ROUTES,
    Extender,
    ExtenderServer,
    ForecastLookup,
    NoForecasts,
    ServerLimits,
    settle_heap,
)

log = logging.getLogger("scheduler_extender")

ENV_PREFIX = "ROSE_EXTENDER_"


def _optional_host_port(text: str) -> tuple[str, int] | None:
    return host_port(text) if text else None


def build_parser() -> argparse.ArgumentParser:
    p = EnvArgumentParser(
        env_prefix=ENV_PREFIX,
        prog="rose extender",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.flag(
        "--listen",
        default="127.0.0.1:8888",
        type=host_port,
        help="HOST:PORT to serve filter/prioritize/preempt (and healthz/readyz/metrics) on; loopback by "
        "default: kube-scheduler runs in the same pod, and nothing else may ask for a preemption",
    )
    p.flag(
        "--metrics-listen",
        default="",
        type=_optional_host_port,
        help="HOST:PORT of a second listener serving only GET /metrics, /healthz and /readyz (no verbs), "
        "for Prometheus and the kubelet's probes (the manifests use 0.0.0.0:9888); empty = none",
    )
    p.flag("--kubeconfig", default="", help="kubeconfig file; empty = in-cluster service account")
    forecast_client.add_flags(p, without="always fall back")
    p.flag("--quantile", default="0.9", help="serving-demand quantile treated as what serving may need")
    p.flag("--default-min-run", default=600.0, type=float, help="RL worker min useful run (s) without annotation")
    p.flag("--fallback-headroom", default=0.25, type=float, help="pool fraction kept free when no forecast")
    p.flag("--fallback-window", default=600.0, type=float, help="idle window (s) assumed by the fallback rule")
    p.flag(
        "--max-body-bytes",
        default=DEFAULT_MAX_BODY,
        type=byte_size,
        help="largest request body accepted (default: the largest nodeCacheCapable call at 5,000 nodes)",
    )
    p.flag("--idle-timeout", default=60.0, type=duration, help="seconds a keep-alive connection may sit idle")
    p.flag("--read-timeout", default=10.0, type=duration, help="seconds a client has to send one whole request")
    p.flag("--max-connections", default=128, type=int, help="connections served at once (one thread each)")
    p.flag(
        "--suspend-request-ttl",
        default=600.0,
        type=duration,
        help="seconds after which the extender withdraws a suspend request whose preemptor is still pending",
    )
    p.flag("--tls-cert-file", default="", help="serve HTTPS with this certificate (optional)")
    p.flag("--tls-key-file", default="", help="private key for --tls-cert-file")
    p.flag("--capture-dir", default="", help="debug: write the first request/reply bodies of each verb here")
    p.flag(
        "--gil-switch-interval",
        default=0.0005,
        type=float,
        help="seconds a Python thread may hold the GIL before another may run (sys.setswitchinterval; "
        "CPython's 5 ms default lets the watch threads delay a scheduling call by up to 5 ms)",
    )
    p.flag("--log-level", default="info", help="debug, info, warning or error")
    return p


def make_forecasts(args: argparse.Namespace, metrics: ExtenderMetrics) -> tuple[ForecastLookup, ForecastCache | None]:
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
            f"rose extender: {e}: set --predictor-url / --forecast-file "
            f"(or {ENV_PREFIX}PREDICTOR_URL / {ENV_PREFIX}FORECAST_FILE)"
        ) from None
    if source is None:
        return NoForecasts(), None
    if isinstance(source, StaticFileForecastSource):
        try:  # a missing or malformed file is refused at start, not discovered at the first call
            source.check()
        except ForecastError as e:
            raise SystemExit(f"rose extender: --forecast-file: {' '.join(str(e).split())}") from None
    fc = ForecastCache(
        source,
        quantile=args.quantile,
        risk=args.risk,
        refresh_s=args.forecast_refresh,
        max_age_s=args.forecast_max_age,
        on_fetch=metrics.on_forecast_fetch,
    )
    return fc, fc


def _bind(flag: str, make: Callable[[], ExtenderServer]) -> ExtenderServer:
    """``make()``; a port that cannot be bound exits with one line naming the flag."""
    try:
        return make()
    except OSError as e:
        raise SystemExit(f"rose extender: cannot listen on {flag}: {e.strerror or e}; choose a free port") from None


def main(argv: list[str] | None = None) -> int:
    return runner.run("rose extender", lambda: build_parser().parse_args(argv), serve)


def settle_loop(cache: ClusterCache, stop: threading.Event) -> None:
    """Once the cache has synced, hand freed heap back to the OS every 5 minutes."""
    while not stop.is_set() and not cache.synced:
        stop.wait(0.5)
    while not stop.is_set():
        settle_heap()
        stop.wait(300)


def known_pools_loop(cache: ClusterCache, refresher: ForecastCache, stop: threading.Event) -> None:
    """Fetch every pool the cache knows before a scheduling call needs it: otherwise the first
    calls after a start, or for a new pool, decide on the conservative fallback."""
    while not stop.is_set():
        if cache.synced:
            refresher.want(cache.snapshot().pools)
        stop.wait(1.0)


def serve(args: argparse.Namespace, r: runner.Runner) -> int:
    if not 0 < args.gil_switch_interval <= 1:
        build_parser().error(f"--gil-switch-interval must be in (0, 1] seconds, got {args.gil_switch_interval}")
    # Watch threads parse events while kube-scheduler waits on a call: hand the GIL over sooner.
    sys.setswitchinterval(args.gil_switch_interval)
    host, port = args.listen
    try:
        limits = ServerLimits(
            max_body=args.max_body_bytes,
            idle_timeout_s=args.idle_timeout,
            read_timeout_s=args.read_timeout,
            max_connections=args.max_connections,
        )
    except ValueError as e:
        build_parser().error(str(e))
    if args.suspend_request_ttl <= 0:
        build_parser().error(f"--suspend-request-ttl must be > 0 seconds, got {args.suspend_request_ttl}")
    cfg = policy.PolicyConfig(
        default_min_run_s=args.default_min_run,
        quantile=args.quantile,
        fallback_headroom=args.fallback_headroom,
        fallback_window_s=args.fallback_window,
    )
    metrics = ExtenderMetrics(forecast_backend=args.forecast_backend)
    forecasts, refresher = make_forecasts(args, metrics)
    from scheduler_extender import kube  # the API-server module, imported only when running

    api = runner.kube_client(args.kubeconfig, env=f"{ENV_PREFIX}KUBECONFIG")
    cache = ClusterCache(cfg)
    watcher = kube.Watcher(api, cache, on_restart=lambda kind: metrics.watch_restarts.labels(kind).inc())
    suspender = kube.KubeSuspender(api, on_result=lambda r: metrics.suspend_requests.labels(r).inc())
    pods = kube.ApiPods(api)
    withdrawer = kube.Withdrawer(
        api, cache, pods, args.suspend_request_ttl, on_withdrawn=lambda r: metrics.suspend_withdrawn.labels(r).inc()
    )
    extender = Extender(
        cache,
        forecasts=forecasts,
        suspender=suspender,
        preemptors=pods,
        cfg=cfg,
        metrics=metrics,
        ready=lambda: cache.synced and (refresher is None or refresher.attempted(cache.snapshot().pools)),
        capture_dir=Path(args.capture_dir) if args.capture_dir else None,
    )
    # the verbs' listener (loopback) also answers /metrics: local tools read it there
    server = _bind(
        "--listen", lambda: ExtenderServer(extender, host, port, limits=limits, routes=VERB_ROUTES | METRICS_ROUTES)
    )
    r.on_stop(server.stop)
    metrics_server = None
    if args.metrics_listen is not None:
        mhost, mport = args.metrics_listen
        metrics_server = _bind(
            "--metrics-listen", lambda: ExtenderServer(extender, mhost, mport, limits=limits, routes=METRICS_ROUTES)
        )
        r.on_stop(metrics_server.stop)
    if args.tls_cert_file:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert_file, args.tls_key_file or None)
        server.httpd.socket = ctx.wrap_socket(server.httpd.socket, server_side=True)
    watcher.start()
    withdrawer.start()
    if metrics_server is not None:
        metrics_server.start()
    if refresher is not None:
        refresher.start()
    r.thread(lambda stop: settle_loop(cache, stop), "settle-heap")
    if refresher is not None:
        r.thread(lambda stop: known_pools_loop(cache, refresher, stop), "forecast-pools")
    metrics_at = f"{metrics_server.url}" if metrics_server is not None else ""
    log.info(
        "extender serving",
        extra={
            "listen": f"{host}:{server.port}",
            "metricsListen": metrics_at,
            "forecastBackend": args.forecast_backend,
        },
    )
    # Write the bound address for callers that asked for port 0.
    print(f"listening on {host}:{server.port}", file=sys.stderr, flush=True)
    server.start()
    try:
        r.stop.wait()
    finally:
        watcher.stop()
        withdrawer.stop()
        suspender.stop()
        if refresher is not None:
            refresher.stop()
    return 0
