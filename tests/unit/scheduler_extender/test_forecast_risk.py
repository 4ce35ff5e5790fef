"""Issue 14 §3: the extender and the planner read the GPUs serving may need over each window at
the operator's risk (``gpus_needed``) when the forecast carries it, and the quantile otherwise."""

from __future__ import annotations

import json

import pytest

from elastic_controller import pools
from elastic_controller.metrics import ControllerMetrics
from elastic_controller.planner import Job, PlanInput, Pool, Settings, Worker, plan
from rose_common import extender_names, forecast_client, forecast_risk
from rose_common.cli import EnvArgumentParser
from rose_common.forecast_api import ForecastPoint, ForecastResponse
from scheduler_extender.forecast import reduce
from scheduler_extender.model import PoolForecast
from scheduler_extender.server import Extender
from tests.support.extender_fixtures import T0, args_body, cluster_cache, pod

# One pool of 8 GPUs. The p90 at each horizon is low (a point forecast misses the burst between
# horizons); the bound on the window's maximum at risk 0.01 is not.
P90 = {600: 3.0, 1800: 3.0, 3600: 3.0}
NEEDED = {600: 6, 1800: 8, 3600: 8}


def response(needed: dict[int, int] | None = NEEDED, unit: str = "gpus", window_max: bool = False) -> ForecastResponse:
    points = []
    for h, q in P90.items():
        extra: dict[str, object] = {}
        if needed is not None and h in needed:
            key = "window_max" if window_max else "gpus_needed"
            extra[key] = {"0.01": needed[h], "0.05": needed[h] - 1}
        points.append(ForecastPoint(horizon_seconds=h, timestamp=T0, quantiles={"0.5": q / 2, "0.9": q}, **extra))  # type: ignore[arg-type]
    return ForecastResponse(
        pool="pool-a",
        unit=unit,
        model_version="t",
        generated_at=T0,
        last_observation_at=T0,
        data_age_seconds=0.0,
        stale=False,
        current=2.0,
        points=points,
    )


def test_risk_key_normalizes_and_refuses_what_is_not_a_risk() -> None:
    assert forecast_risk.risk_key("0.010") == "0.01" and forecast_risk.risk_key(" ") == ""
    for bad in ("1%", "0", "0.5", "-0.01"):
        with pytest.raises(ValueError, match=r"--risk must be a share of windows in \(0, 0.5\)"):
            forecast_risk.risk_key(bad)


def test_risk_flag_error_is_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    p = EnvArgumentParser(env_prefix="ROSE_TEST_", prog="t")
    forecast_client.add_flags(p, without="x")
    assert p.parse_args(["--risk", "0.050"]).risk == "0.05"
    with pytest.raises(SystemExit):
        p.parse_args(["--risk", "5"])
    assert "--risk must be a share of windows" in capsys.readouterr().err


def test_at_risk_reads_gpus_needed_then_window_max_in_gpus_else_nothing() -> None:
    assert forecast_risk.at_risk(response(), "0.01") == ((600, 6.0), (1800, 8.0), (3600, 8.0))
    assert forecast_risk.at_risk(response(window_max=True), "0.05") == ((600, 5.0), (1800, 7.0), (3600, 7.0))
    assert forecast_risk.at_risk(response(window_max=True, unit="requests"), "0.01") is None  # not GPUs
    assert forecast_risk.at_risk(response(), "0.02") is None  # a risk the predictor does not serve
    assert forecast_risk.at_risk(response(), "") is None
    odd = response().model_copy(
        update={"points": [p.model_copy(update={"gpus_needed": {"x": 1}}) for p in response().points]}
    )
    assert forecast_risk.at_risk(odd, "0.01") is None  # a key that is no risk
    assert forecast_risk.at_risk(response(None), "0.01") is None  # an older predictor
    assert forecast_risk.at_risk(response({600: 6}), "0.01") is None  # not every point


def test_planner_step_function_holds_the_tightest_window_at_risk() -> None:
    fc = pools.to_forecast(response(), "0.9", risk="0.01")
    assert fc.quantile == "at risk 0.01"
    assert fc.upper[:10] == (6.0,) * 10 and fc.upper[10:30] == (8.0,) * 20 and len(fc.upper) == 60
    plain = pools.to_forecast(response(), "0.9")
    assert plain.quantile == "p90" and max(plain.upper) == 3.0
    assert pools.to_forecast(response(), "0.9", risk="0.02") == plain  # fallback: backward compatible


def _plan(risk: str) -> tuple[int, tuple[str, ...]]:
    fc = pools.to_forecast(response(), "0.9", risk=risk)
    job = Job("ns/a", 2, 4, grace_s=30.0, suspend_s=5.0, min_useful_run_s=300.0)
    workers = tuple(Worker(f"a-w{i}", "ns/a", "active", "pool-a") for i in range(4))
    p = plan(PlanInput(fc.start + 1, (Pool("pool-a", 8, fc),), (job,), workers, Settings(dwell_s=300)))
    return p.targets["ns/a"].active_gpus, p.targets["ns/a"].reasons


def test_planner_reclaims_at_risk_where_the_quantile_would_keep_lending() -> None:
    """The decision differs because of gpus_needed: at p90 (3 of 8) four lent GPUs stay; at risk
    0.01 serving may need 6 within the lead time, so two workers are shrunk now."""
    assert _plan("") == (4, ())
    active, reasons = _plan("0.01")
    assert active == 2 and all("serving at risk 0.01 needs 6 of 8" in r for r in reasons)


def test_controller_metric_counts_what_the_forecast_is_read_as() -> None:
    m = ControllerMetrics()
    m.on_forecast(pools.to_forecast(response(), "0.9", risk="0.01"))
    m.on_forecast(pools.to_forecast(response(None), "0.9", risk="0.01"))
    assert m.registry.get_sample_value("rose_controller_forecast_basis_total", {"basis": "risk"}) == 1
    assert m.registry.get_sample_value("rose_controller_forecast_basis_total", {"basis": "quantile"}) == 1


class _Forecasts:
    def __init__(self, risk: str) -> None:
        self.fc = reduce(response(), "0.9", risk=risk)

    def get(self, pool: str) -> PoolForecast | None:
        return self.fc if pool == "pool-a" else None


def _filter(risk: str) -> dict[str, object]:
    ext = Extender(cluster_cache({"pool-a": ["n0", "n1"]}, gpus=4), forecasts=_Forecasts(risk), clock=T0.timestamp)
    worker = pod("w0", "u-0", ns="demo", job="grpo", annotations={extender_names.ANNOTATION_MIN_RUN: "1200"})
    code, body = ext.handle("filter", args_body(worker, ["n0", "n1"]))
    assert code == 200
    return dict(json.loads(body))


def test_extender_filters_at_risk_where_the_quantile_would_lend() -> None:
    """The same reply: at p90 the pool is idle for the hour; at risk 0.01 serving may take all 8
    GPUs within 30 min, so a worker needing 20 min of run finds no node, and the reason says why."""
    assert _filter("")["NodeNames"] == ["n0", "n1"]
    at_risk = _filter("0.01")
    assert not at_risk["NodeNames"]
    reasons = dict(at_risk["FailedAndUnresolvableNodes"])  # type: ignore[call-overload]
    assert "(at risk 0.01) needs pool 'pool-a' within 600s" in reasons["n0"]
    assert reduce(response(None), "0.9", risk="0.01").basis == "quantile"  # an older predictor


def test_forecast_horizons_flag_names_what_the_http_backend_asks_for(capsys: pytest.CaptureFixture[str]) -> None:
    """A time-compressed predictor (the soak's) serves horizons in seconds: the consumers ask for them."""
    p = EnvArgumentParser(env_prefix="ROSE_TEST_", prog="t")
    forecast_client.add_flags(p, without="x")
    assert p.parse_args([]).forecast_horizons == "10m,30m,60m"
    args = p.parse_args(["--forecast-horizons", "6s, 19s,38s"])
    assert args.forecast_horizons == "6s,19s,38s"
    src = forecast_client.make_source("http", url="http://127.0.0.1:9", horizons=args.forecast_horizons)
    assert isinstance(src, forecast_client.HttpForecastSource)
    with pytest.raises(forecast_client.ForecastError, match=r"horizon=6s%2C19s%2C38s"):
        src.fetch("pool-a")  # nothing listens on port 9: the error names the URL it asked
    with pytest.raises(SystemExit):
        p.parse_args(["--forecast-horizons", "ten minutes"])
    err = capsys.readouterr().err
    assert "--forecast-horizons 'ten minutes': give durations such as 10m,30m,60m" in err
