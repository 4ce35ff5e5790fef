"""``rose simulate``: how many GPU-hours would RL get from this serving fleet, and what would serving pay?

    rose simulate --series FILE.csv --jobs DIR [--json OUT.json] [--report OUT.png] [--markdown OUT.md]
    rose simulate --prometheus URL --query PROMQL --start T --end T --step D --jobs DIR [...]

I/O boundary: argv, the series CSV or one Prometheus range query (``rose_sim.prometheus``, the
predictor's ingestion), the jobs' YAML, stdout, the files named by flags. Every failure is one
line on stderr and exit status 2 (bad flags, an unknown series format, a query that fails or
returns nothing, a job the CRD refuses, a series shorter than the history); docs/simulate.md
describes the model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path

from predictor.series import format_duration, parse_duration
from rose_sim.engine import POOL, SimConfig, default_policies
from rose_sim.inputs import CostModel, Demand, SimInputError, load_demand, load_jobs, load_pools
from rose_sim.prometheus import load_prometheus, parse_time
from rose_sim.report import FORECASTERS, markdown, plot, simulate
from rose_sim.shares import MAX_SHARES_PER_GPU

KNOWN_FORECASTERS = ("oracle", "baseline", "model")
COST_HELP = {
    "pcie_bytes_per_s": "bytes/s a suspend or resume moves over PCIe (the controller's planning rate)",
    "pin_s": "seconds to pin host buffers per suspend",
    "pod_start_s": "seconds from a new worker's creation to its process running",
    "world_change_s": "seconds every running worker of a job stalls when its set of workers changes",
    "storage_bytes_per_s": "bytes/s of durable checkpoint writes and restores",
    "evict_s": "seconds an evicted worker takes to exit and free its GPU",
    "scaling_efficiency": "progress each added worker brings, as a share of one worker's",
    "weight_pull_s": "seconds a new rollout worker (spec.roles) pulls the policy weights after its pod starts",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"rose simulate: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _duration(text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text[:40]!r}") from None
    if not 1 <= v <= 100_000:
        raise argparse.ArgumentTypeError(f"{v} is out of range: use 1..100000")
    return v


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"{text} must be in (0, 1]")
    return v


def _gib(text: str) -> int:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of GiB: {text[:40]!r}") from None
    if not 0 <= v < 1e9:
        raise argparse.ArgumentTypeError(f"{text} GiB is out of range: use 0 or more")
    return int(v * 2**30)


def _shares(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of shares per GPU: {text[:40]!r}") from None
    if not 1 <= v <= MAX_SHARES_PER_GPU:
        raise argparse.ArgumentTypeError(f"{v} shares per GPU: use 1..{MAX_SHARES_PER_GPU} (compute steps of 5 %)")
    return v


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="rose simulate", description=__doc__.split("\n")[0])
    src = ap.add_argument_group("serving demand: --series, or the Prometheus range query")
    src.add_argument("--series", type=Path, help="serving demand, a CSV in the traces' format (time,value)")
    src.add_argument(
        "--pools",
        type=Path,
        metavar="FILE.yaml",
        help="several pools: 'pools:' a list of {name, gpus, series[, capacity_per_gpu | peak_util | "
        "busy_gpus]} (instead of --series and --pool-gpus)",
    )
    src.add_argument("--prometheus", metavar="URL", help="Prometheus base URL (instead of --series)")
    src.add_argument("--query", help="PromQL returning one series: the serving demand (with --prometheus)")
    src.add_argument("--start", help="range start: epoch seconds, ISO-8601, now or now-<duration> (now-21d)")
    src.add_argument("--end", default="now", help="range end, as --start (now)")
    src.add_argument("--step", type=_duration, default=60, help="range step; --tick must divide it (60s)")
    ap.add_argument("--jobs", type=Path, required=True, help="an ElasticRLJob YAML file or a folder of them")
    ap.add_argument("--json", type=Path, help="write the report as JSON here")
    ap.add_argument("--markdown", type=Path, help="write the markdown table here (it is printed anyway)")
    ap.add_argument("--report", type=Path, help="write one PNG here")
    ap.add_argument("--pool-gpus", type=_positive_int, help="GPUs of the pool (64)")
    ap.add_argument(
        "--peak-util",
        type=_fraction,
        default=0.9,
        help="the history's peak uses this share of the pool (0.9); sizes what one GPU serves",
    )
    ap.add_argument("--capacity-per-gpu", type=float, help="demand one GPU serves (instead of --peak-util)")
    ap.add_argument("--busy-gpus", action="store_true", help="the series already counts busy serving GPUs")
    ap.add_argument(
        "--history",
        type=_duration,
        default=7 * 86400,
        help="the start of the series used only to size and tune, never evaluated (7d)",
    )
    ap.add_argument("--tick", type=_duration, default=60, help="decision and accounting step (60s)")
    ap.add_argument("--risk", default="0.01", help="the operator's risk for the forecasts in the loop (0.01)")
    ap.add_argument(
        "--refit-every",
        type=_duration,
        default=86400,
        help="refit the predictor's model this often (1d; the service refits hourly)",
    )
    ap.add_argument(
        "--host-memory",
        type=_gib,
        metavar="GIB",
        help="GiB of host memory suspended state may hold, the pool's nodes together (no limit); "
        "a suspend that does not fit is checkpointed and evicted, as the driver does",
    )
    ap.add_argument("--dwell", type=_duration, default=300, help="the controller's --dwell (5m)")
    ap.add_argument(
        "--gpu-shares",
        type=_shares,
        metavar="N",
        help="also report what lending serving's forecast idle fraction of its partly used GPUs, in "
        f"shares of 1/N GPU, adds (1..{MAX_SHARES_PER_GPU}; issue 27 §3)",
    )
    ap.add_argument(
        "--forecasters",
        default=",".join(FORECASTERS),
        help=f"planned policies, one per forecaster: {', '.join(KNOWN_FORECASTERS)}",
    )
    for f in fields(CostModel):
        ap.add_argument(
            f"--cost-{f.name.replace('_', '-')}",
            type=float,
            default=f.default,
            help=f"{COST_HELP[f.name]} ({f.default:g})",
        )
    return ap


def _demand(a: argparse.Namespace) -> tuple[Demand, str]:
    """The demand from ``--series`` or from the Prometheus range query (exactly one), and what it was."""
    kw = {
        "tick_s": a.tick,
        "history_s": a.history,
        "pool_gpus": a.pool_gpus,
        "peak_util": a.peak_util,
        "capacity_per_gpu": 1.0 if a.busy_gpus else a.capacity_per_gpu,
    }
    if (a.series is None) == (a.prometheus is None):
        raise SimInputError(
            "give the demand as --series FILE.csv, as --prometheus URL --query Q --start T, or --pools FILE.yaml (one)"
        )
    if a.series is not None:
        if a.query is not None or a.start is not None:
            raise SimInputError("--query / --start go with --prometheus, not with --series")
        return load_demand(a.series, **kw), str(a.series)
    if a.query is None or a.start is None:
        raise SimInputError("--prometheus needs --query (one series of serving demand) and --start")
    now = time.time()
    start, end = parse_time(a.start, now, "--start"), parse_time(a.end, now, "--end")
    demand = load_prometheus(a.prometheus, a.query, start, end, a.step, **kw)
    return demand, f"prometheus {a.prometheus} {a.query} [{start}, {end}] step {a.step}s"


def run(a: argparse.Namespace) -> int:
    try:
        risk = float(a.risk)
    except ValueError:
        raise SimInputError(f"--risk {a.risk!r} is not a number") from None
    if not 0 < risk < 0.5:
        raise SimInputError(f"--risk {a.risk} must be in (0, 0.5)")
    wanted = tuple(x.strip() for x in a.forecasters.split(",") if x.strip())
    unknown = [x for x in wanted if x not in KNOWN_FORECASTERS]
    if unknown:
        raise SimInputError(f"--forecasters: unknown {', '.join(unknown)}; known: {', '.join(KNOWN_FORECASTERS)}")
    cost = CostModel(**{f.name: getattr(a, f"cost_{f.name}") for f in fields(CostModel)})
    jobs = load_jobs(a.jobs)
    more: list[tuple[str, int, Demand]] = []
    if a.pools is not None:
        if a.series is not None or a.prometheus is not None or a.pool_gpus is not None:
            raise SimInputError(
                "--pools gives every pool's series and GPUs: drop --series / --prometheus / --pool-gpus"
            )
        if a.busy_gpus or a.capacity_per_gpu is not None:
            raise SimInputError("with --pools, give busy_gpus / capacity_per_gpu per pool in the YAML, not as flags")
        pools = load_pools(a.pools, tick_s=a.tick, history_s=a.history, peak_util=a.peak_util)
        (pool_name, a.pool_gpus, demand), more = pools[0], pools[1:]
        source = f"pools {a.pools}: " + ", ".join(f"{n} ({g} GPUs)" for n, g, _ in pools)
    else:
        a.pool_gpus = a.pool_gpus or 64
        pool_name = POOL
        demand, source = _demand(a)
    cfg = SimConfig(
        pool_name=pool_name,
        pool_gpus=a.pool_gpus,
        risk=a.risk,
        dwell_s=float(a.dwell),
        refit_every_s=a.refit_every,
        host_memory_bytes=a.host_memory,
    )
    report = simulate(demand, jobs, cost, cfg, wanted, default_policies(wanted), tuple(more), a.gpu_shares)
    report["series"] = source
    name = a.series.name if a.series is not None else a.query if a.pools is None else a.pools.name
    title = (
        f"{name}: {report['pool_gpus']} GPUs, {len(jobs)} jobs, {report['evaluated_days']} days evaluated "
        f"after {format_duration(a.history)} of history"
    )
    table = markdown(report, title)
    print(table)
    if a.json is not None:
        a.json.write_text(json.dumps(report, indent=1) + "\n")
    if a.markdown is not None:
        a.markdown.write_text(table + "\n")
    if a.report is not None:
        plot(report, a.report, title)
    return 0


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        return run(a)
    except SimInputError as e:
        print(f"rose simulate: error: {e}", file=sys.stderr)
        return 2
