"""``rose predictor {serve,backtest,evaluate,generate}``: every flag also reads ROSE_PREDICTOR_<FLAG>.

I/O boundary: argv, the environment, stdout/stderr, the files named by flags, and (``serve``) the
listening socket. Every flag value is range-checked when parsed: an absurd one (a 400-digit
``--step``, a port that cannot be bound) is a one-line ``error: ...`` and exit status 2, never
a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rose_common import runner
from rose_common.cli import EnvArgumentParser, host_port

log = logging.getLogger("rose.predictor")

ENV_PREFIX = "ROSE_PREDICTOR_"
MAX_DURATION = 400 * 86400  # seconds: longer than any history, horizon or interval that makes sense
MAX_GENERATED_POINTS = 10_000_000


def duration_flag(maximum: int = MAX_DURATION) -> Callable[[str], int]:
    """An argparse type: a positive whole-second duration (``30s``, ``5m``, ``1h``) up to ``maximum``."""
    from predictor.series import format_duration, parse_duration

    def parse(text: str) -> int:
        try:
            seconds = parse_duration(text)
        except (ValueError, OverflowError) as e:
            raise argparse.ArgumentTypeError(
                str(e) if isinstance(e, ValueError) else f"{text[:40]!r} is too large"
            ) from None
        if seconds > maximum:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is too long: at most {format_duration(maximum)}")
        return seconds

    parse.__name__ = "duration"
    return parse


def bounded_int(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: a whole number in ``lo..hi``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text[:40]!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is out of range: use {lo}..{hi}")
        return value

    parse.__name__ = "integer"
    return parse


def _parser() -> argparse.ArgumentParser:
    parse_duration = duration_flag()
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
    s.flag(
        "--max-connections", help="HTTP connections at once (beyond: 503)", default="256", type=bounded_int(1, 65536)
    )
    s.flag(
        "--max-connections-per-client",
        help="HTTP connections at once from one client address (beyond: 503)",
        default="64",
        type=bounded_int(1, 65536),
    )
    s.flag(
        "--idle-timeout", help="close a keep-alive connection idle this long", default="30s", type=duration_flag(3600)
    )
    s.flag("--step", help="resampling step (e.g. 60s, 1m; at most 1d)", default="60s", type=duration_flag(86400))
    s.flag("--history", help="history kept in memory and trained on", default="14d", type=parse_duration)
    s.flag("--horizons", help="forecast horizons", default="10m,30m,60m")
    s.flag("--quantiles", help="quantiles besides the median", default="0.9")
    s.flag("--risks", help="target risks served as window-max bounds, e.g. 0.01,0.05 (empty: none)", default="")
    s.flag("--retrain-interval", help="refit each pool's model this often", default="1h", type=parse_duration)
    s.flag(
        "--max-model-age",
        help="a persisted model older than this is not loaded at start but refit first (0: any age)",
        default="7d",
        type=_max_model_age,
    )
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
    _series_flag(b)
    b.flag("--horizons", help="comma-separated horizons", default="10m,30m,60m")
    b.flag("--quantile", help="the upper quantile whose coverage is reported", default="0.9", type=float)
    b.flag("--json", help="write the results here (JSON)", required=True, type=Path)
    b.flag("--plot", help="write a PNG of forecasts vs. actuals here", type=Path)
    b.flag("--initial-train", help="history before the first origin (default: half the series)", type=parse_duration)
    b.flag("--refit-every", help="refit interval (default: 1d, or a tenth of the series)", type=parse_duration)
    b.flag("--threads", help="CPU threads for fitting", default="1", type=bounded_int(1, 1024))

    _add_evaluate(sub)

    g = sub.add_parser("generate", help="write a deterministic synthetic serving-demand series (CSV)")
    g.flag("--days", help="length in days", default="14", type=float)
    g.flag("--step", help="step in seconds (1..86400)", default="60", type=bounded_int(1, 86400))
    g.flag("--seed", help="random seed (same seed, same series)", default="7", type=int)
    g.flag("--level", help="typical demand level (e.g. busy GPUs)", default="40", type=float)
    g.flag("--gaps", help="fraction of steps left as gaps", default="0", type=float)
    g.flag("--out", help="CSV to write", required=True, type=Path)
    return ap


def _series_flag(p: Any) -> None:
    p.flag(
        "--series",
        help="CSV with a header: time (seconds or ISO-8601), value; empty = gap",
        required=True,
        type=Path,
    )


def _add_evaluate(sub: Any) -> None:
    parse_duration = duration_flag()
    e = sub.add_parser("evaluate", help="GPU-time lent at a target risk: the model vs. tuned baselines and an oracle")
    _series_flag(e)
    e.flag("--risk", help="target under-provision risks, comma-separated (e.g. 0.01,0.05)", default="0.01,0.05")
    e.flag("--gpus-at-peak", help="pool size: the series' peak needs this many GPUs (default 64)", type=int)
    e.flag(
        "--capacity-per-gpu", help="pool size from the demand one GPU serves (instead of --gpus-at-peak)", type=float
    )
    e.flag("--horizons", help="comma-separated windows [now, now + H]", default="30m,60m")
    e.flag(
        "--initial-train",
        help="training part before the first origin (default: half the series)",
        type=parse_duration,
    )
    e.flag("--json", help="write the results here (JSON)", required=True, type=Path)
    e.flag("--plot", help="write a PNG (demand, reservations, GPUs lent, under-provisions) here", type=Path)


def _parse_risks(text: str) -> list[float]:
    try:
        risks = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"bad risk list {text!r}: use numbers in (0, 0.5), e.g. 0.01,0.05") from None
    bad = [r for r in risks if not 0.0 < r < 0.5]
    if bad or not risks:
        raise ValueError(f"bad risk list {text!r}: every risk must be in (0, 0.5), e.g. 0.01,0.05")
    return risks


def cmd_evaluate(a: argparse.Namespace) -> int:
    from predictor.evaluate import evaluate, plot, write_json
    from predictor.risk import NotEnoughWindows
    from predictor.series import SeriesError, read_series_csv

    try:
        horizons = _horizons(a.horizons)
        risks = _parse_risks(a.risk)
        series = read_series_csv(a.series)
        init = None if a.initial_train is None else -(-int(a.initial_train) // series.step)
        result = evaluate(
            series,
            horizons,
            risks,
            gpus_at_peak=None if a.gpus_at_peak is None else int(a.gpus_at_peak),
            capacity_per_gpu=None if a.capacity_per_gpu is None else float(a.capacity_per_gpu),
            initial_train=init,
        )
    except (SeriesError, NotEnoughWindows, ValueError, OverflowError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result.table())
    write_json(result, a.json)
    if a.plot is not None:
        plot(result, series, a.plot)
    return 0


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
    from predictor.series import SeriesError, read_series_csv

    try:
        horizons = _horizons(a.horizons)
        series = read_series_csv(a.series)
        init = None if a.initial_train is None else -(-int(a.initial_train) // series.step)
        refit = None if a.refit_every is None else max(1, int(a.refit_every) // series.step)
        with threadpool_limits(limits=int(a.threads)):
            result = backtest(
                series, horizons, float(a.quantile), initial_train=init, refit_every=refit, progress=_fit_progress
            )
    except (SeriesError, NotEnoughHistory, ValueError, OverflowError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result.table())
    write_json(result, a.json)
    if a.plot is not None:
        plot(result, series, a.plot)
    return 0


def _fit_progress(done: int, total: int) -> None:
    """Backtest progress on stderr (stdout keeps only the result table)."""
    print(f"backtest: fit {done}/{total}", file=sys.stderr, flush=True)


def cmd_generate(a: argparse.Namespace) -> int:
    from predictor.generator import generate
    from predictor.series import write_series_csv

    try:
        points = float(a.days) * 86400 / int(a.step)
        if not points <= MAX_GENERATED_POINTS:
            raise ValueError(
                f"--days {a.days} at --step {a.step} is {points:.3g} points; at most {MAX_GENERATED_POINTS:,}"
            )
        s = generate(float(a.days), int(a.step), seed=int(a.seed), level=float(a.level), gap_fraction=float(a.gaps))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_series_csv(s, a.out, header=("t_seconds", "busy_gpus"))
    print(f"wrote {len(s)} points ({s.step}s step) to {a.out}")
    return 0


def _horizons(text: str) -> list[int]:
    """``--horizons``: each a whole-second duration of at most 7 days."""
    from predictor.series import parse_durations

    try:
        horizons = parse_durations(text)
    except OverflowError:
        raise ValueError(f"--horizons {text[:40]!r}: a horizon is too large (at most 7d)") from None
    if horizons[-1] > 7 * 86400:
        raise ValueError(f"--horizons {text[:40]!r}: a horizon is too large (at most 7d)")
    return horizons


def _max_model_age(text: str) -> int:
    """``--max-model-age``: a duration, or 0 for no bound."""
    return 0 if text.strip() == "0" else duration_flag()(text)


def cmd_serve(a: argparse.Namespace, ready: Callable[[str], None] | None = None) -> int:
    return runner.run("rose predictor serve", lambda: a, lambda args, r: serve(args, r, ready), logger="rose")


def serve(a: argparse.Namespace, r: runner.Runner, ready: Callable[[str], None] | None = None) -> int:
    from predictor.ingest import PrometheusSource
    from predictor.model import ModelConfig
    from predictor.server import Limits, PredictorHTTPServer, serve_in_thread
    from predictor.service import PredictorService, Settings, Source, load_pools
    from predictor.store import ModelStore

    try:
        pools = load_pools(a.pools)
        model_cfg = ModelConfig(
            horizons=tuple(_horizons(a.horizons)),
            quantiles=_parse_quantiles(a.quantiles),
            day=int(a.season_day),
            week=int(a.season_week),
        )
        for h in model_cfg.horizons:
            if h % int(a.step):
                raise ValueError(f"horizon {h}s is not a multiple of --step {a.step}s")
        risks = tuple(_parse_risks(a.risks)) if str(a.risks).strip() else ()
        address: tuple[str, int] = a.listen
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    settings = Settings(
        step=int(a.step),
        history=int(a.history),
        retrain_interval=float(a.retrain_interval),
        max_model_age=float(a.max_model_age),
        refresh_interval=float(a.refresh_interval),
        max_data_age=float(a.max_data_age),
        risks=risks,
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
        log.warning("replaying a recorded series instead of querying Prometheus", extra={"replay": a.replay})
    else:
        source = PrometheusSource(a.prometheus_url)
    service = PredictorService(pools, source, settings, store)
    try:
        limits = Limits(
            max_connections=a.max_connections,
            idle_timeout=float(a.idle_timeout),
            max_connections_per_client=min(a.max_connections_per_client, a.max_connections),
        )
        server = PredictorHTTPServer(address, service, limits)
    except OSError as e:
        print(f"error: cannot listen on --listen {address[0]}:{address[1]}: {e.strerror or e}", file=sys.stderr)
        return 2
    serve_in_thread(server)
    if ready is not None:
        ready(server.url)
    try:
        service.run(r.stop)
    finally:
        server.shutdown()
        server.server_close()
        log.info("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "backtest":
        return cmd_backtest(args)
    if args.command == "evaluate":
        return cmd_evaluate(args)
    if args.command == "generate":
        return cmd_generate(args)
    return cmd_serve(args)
