"""``rose predictor {serve,backtest,generate}``: every flag also reads ROSE_PREDICTOR_<FLAG>."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from predictor import logs
from rose_common.cli import EnvArgumentParser, host_port

ENV_PREFIX = "ROSE_PREDICTOR_"


def _parser() -> argparse.ArgumentParser:
    from predictor.series import parse_duration

    ap = EnvArgumentParser(
        env_prefix=ENV_PREFIX,
        prog="rose predictor",
        description="Serving-demand forecasts per GPU pool: serve them, backtest them, generate demo data.",
    )
    sub = ap.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="ingest from Prometheus, retrain periodically, serve /v1/forecast and /metrics")
    s.flag("--prometheus-url", help="Prometheus base URL", default="http://127.0.0.1:9090")
    s.flag("--pools", help="YAML file: pools: [{name, query, unit, capacity}]", required=True, type=Path)
    s.flag("--listen", help="address:port to serve HTTP on", default="0.0.0.0:8080", type=host_port)
    s.flag("--step", help="resampling step (e.g. 60s, 1m)", default="60s", type=parse_duration)
    s.flag("--history", help="history kept in memory and trained on", default="14d", type=parse_duration)
    s.flag("--horizons", help="forecast horizons", default="10m,30m,60m")
    s.flag("--quantiles", help="quantiles besides the median", default="0.9")
    s.flag("--retrain-interval", help="refit each pool's model this often", default="1h", type=parse_duration)
    s.flag(
        "--refresh-interval",
        help="query Prometheus and refresh forecasts this often",
        default="30s",
        type=parse_duration,
    )
    s.flag(
        "--max-data-age",
        help="newest sample older than this → stale + safe upper bound",
        default="5m",
        type=parse_duration,
    )
    s.flag("--model-dir", help="where versioned models are persisted (empty: not persisted)", default="")
    s.flag(
        "--season-day",
        help="length of the daily season (compressed time in demos/tests)",
        default="1d",
        type=parse_duration,
    )
    s.flag("--season-week", help="length of the weekly season", default="7d", type=parse_duration)
    s.flag("--log-level", help="debug, info, warning, error", default="info")
    s.flag("--replay", help="demo: replay this CSV (or 'generated') instead of querying Prometheus", default="")

    b = sub.add_parser("backtest", help="rolling-origin backtest of the model and the baselines on a CSV series")
    b.flag(
        "--series",
        help="CSV with a header: time (seconds or ISO-8601), value; empty = gap",
        required=True,
        type=Path,
    )
    b.flag("--horizons", help="comma-separated horizons", default="10m,30m,60m")
    b.flag("--quantile", help="the upper quantile whose coverage is reported", default="0.9", type=float)
    b.flag("--json", help="write the results here (JSON)", required=True, type=Path)
    b.flag("--plot", help="write a PNG of forecasts vs. actuals here", type=Path)
    b.flag("--initial-train", help="history before the first origin (default: half the series)", type=parse_duration)
    b.flag("--refit-every", help="refit interval (default: 1d, or a tenth of the series)", type=parse_duration)
    b.flag("--threads", help="CPU threads for fitting", default="1", type=int)

    g = sub.add_parser("generate", help="write a deterministic synthetic serving-demand series (CSV)")
    g.flag("--days", help="length in days", default="14", type=float)
    g.flag("--step", help="step in seconds", default="60", type=int)
    g.flag("--seed", help="random seed (same seed, same series)", default="7", type=int)
    g.flag("--level", help="typical demand level (e.g. busy GPUs)", default="40", type=float)
    g.flag("--gaps", help="fraction of steps left as gaps", default="0", type=float)
    g.flag("--out", help="CSV to write", required=True, type=Path)
    return ap


def _parse_quantiles(text: str) -> tuple[float, ...]:
    try:
        qs = tuple(sorted({float(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise ValueError(f"bad --quantiles {text!r}: use numbers in (0,1), e.g. 0.9 or 0.1,0.9") from None
    return qs


def cmd_backtest(a: argparse.Namespace) -> int:
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    from predictor.backtest import backtest, plot, write_json
    from predictor.model import NotEnoughHistory
    from predictor.series import SeriesError, parse_durations, read_series_csv

    try:
        horizons = parse_durations(a.horizons)
        series = read_series_csv(a.series)
        init = None if a.initial_train is None else -(-int(a.initial_train) // series.step)
        refit = None if a.refit_every is None else max(1, int(a.refit_every) // series.step)
        with threadpool_limits(limits=int(a.threads)):
            result = backtest(series, horizons, float(a.quantile), initial_train=init, refit_every=refit)
    except (SeriesError, NotEnoughHistory, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result.table())
    write_json(result, a.json)
    if a.plot is not None:
        plot(result, series, a.plot)
    return 0


def cmd_generate(a: argparse.Namespace) -> int:
    from predictor.generator import generate
    from predictor.series import write_series_csv

    try:
        s = generate(float(a.days), int(a.step), seed=int(a.seed), level=float(a.level), gap_fraction=float(a.gaps))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_series_csv(s, a.out, header=("t_seconds", "busy_gpus"))
    print(f"wrote {len(s)} points ({s.step}s step) to {a.out}")
    return 0


def cmd_serve(a: argparse.Namespace, ready: Callable[[str], None] | None = None) -> int:
    from predictor.ingest import PrometheusSource
    from predictor.model import ModelConfig
    from predictor.series import parse_durations
    from predictor.server import PredictorHTTPServer, serve_in_thread
    from predictor.service import PredictorService, Settings, Source, load_pools
    from predictor.store import ModelStore

    logs.setup(a.log_level)
    try:
        pools = load_pools(a.pools)
        model_cfg = ModelConfig(
            horizons=tuple(parse_durations(a.horizons)),
            quantiles=_parse_quantiles(a.quantiles),
            day=int(a.season_day),
            week=int(a.season_week),
        )
        for h in model_cfg.horizons:
            if h % int(a.step):
                raise ValueError(f"horizon {h}s is not a multiple of --step {a.step}s")
        address: tuple[str, int] = a.listen
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    settings = Settings(
        step=int(a.step),
        history=int(a.history),
        retrain_interval=float(a.retrain_interval),
        refresh_interval=float(a.refresh_interval),
        max_data_age=float(a.max_data_age),
        model=model_cfg,
    )
    store = ModelStore(Path(a.model_dir)) if a.model_dir else None
    source: Source
    if a.replay:
        from predictor.generator import generate
        from predictor.replay import ReplaySource
        from predictor.series import SeriesError, read_series_csv

        try:
            replayed = generate(14, int(a.step)) if a.replay == "generated" else read_series_csv(Path(a.replay))
            # the last day (at most half) is revealed in real time, the rest is history
            source = ReplaySource(replayed, lead=min(len(replayed) // 2, 86400 // replayed.step))
        except SeriesError as e:
            print(f"error: --replay: {e}", file=sys.stderr)
            return 2
        logs.warning("replaying a recorded series instead of querying Prometheus", replay=a.replay)
    else:
        source = PrometheusSource(a.prometheus_url)
    service = PredictorService(pools, source, settings, store)
    server = PredictorHTTPServer(address, service)
    serve_in_thread(server)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if ready is not None:
        ready(server.url)
    try:
        service.run(stop)
    finally:
        server.shutdown()
        server.server_close()
        logs.info("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "backtest":
        return cmd_backtest(args)
    if args.command == "generate":
        return cmd_generate(args)
    return cmd_serve(args)
