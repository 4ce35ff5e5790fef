"""The controller's small pure parts: the lease decision, pool capacities, forecast step functions."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from elastic_controller import leader, pools
from rose_common import names
from rose_common.forecast_api import ForecastPoint, ForecastResponse
from rose_common.slices import GpuInfo, resource_slice

NOW = dt.datetime(2026, 11, 30, 14, 0, tzinfo=dt.UTC)


def test_decide_acquires_renews_follows_and_takes_over_only_when_expired() -> None:
    new = leader.decide(None, "a", NOW, 15)
    assert new.leader and new.write is not None and new.write.holder == "a"
    held = leader.LeaseRecord("b", 15, NOW, NOW)
    assert leader.decide(held, "a", NOW + dt.timedelta(seconds=15), 15) == leader.Decision(None, False, "held by b")
    late = leader.decide(held, "a", NOW + dt.timedelta(seconds=16), 15)
    assert late.leader and late.write is not None and late.write.transitions == 1
    mine = leader.decide(held, "b", NOW + dt.timedelta(seconds=5), 15)
    assert mine.write is not None and mine.write.renewed == NOW + dt.timedelta(seconds=5)
    with pytest.raises(ValueError, match="lease duration"):
        leader.decide(None, "a", NOW, 0)


def test_lease_record_round_trips_through_the_lease_spec() -> None:
    rec = leader.LeaseRecord("a", 15, NOW, NOW + dt.timedelta(seconds=3), 2)
    assert leader.LeaseRecord.from_spec(rec.to_spec()) == rec
    assert leader.LeaseRecord.from_spec({"holderIdentity": "a"}) is None


def test_capacities_count_physical_gpus_of_each_pools_nodes() -> None:
    nodes = [
        {"metadata": {"name": "n0", "labels": {names.LABEL_POOL: "a"}}},
        {"metadata": {"name": "n1", "labels": {names.LABEL_POOL: "b"}}},
        {"metadata": {"name": "n2", "labels": {names.LABEL_POOL: "b"}}},
    ]
    gpus = [GpuInfo(i, f"G{i}", "sim", 1) for i in range(2)]
    slices = [resource_slice(n, gpus, 1) for n in ("n0", "n1", "n2", "elsewhere")]
    assert pools.capacities(nodes, slices) == {"a": 2, "b": 4}


def _resp(points: dict[int, float], current: float | None = None) -> ForecastResponse:
    return ForecastResponse(
        pool="a",
        model_version="t",
        generated_at=NOW,
        last_observation_at=NOW,
        data_age_seconds=0.0,
        stale=False,
        current=current,
        points=[
            ForecastPoint(horizon_seconds=h, timestamp=NOW, quantiles={"0.5": 0.0, "0.9": v}) for h, v in points.items()
        ],
    )


def test_to_forecast_holds_the_larger_neighbour_and_ends_at_the_horizon() -> None:
    f = pools.to_forecast(_resp({600: 2.0, 1800: 5.0, 3600: 1.0}, current=3.0), "0.9")
    t = NOW.timestamp()
    assert f.start == t and f.step == 60 and len(f.upper) == 60
    assert f.peak(t, t + 599) == 3.0  # current 3 > 2 at 10 min
    assert f.peak(t + 600, t + 659) == 5.0  # between 2 (10 min) and 5 (30 min): the larger
    assert f.peak(t + 1800, t + 1859) == 5.0
    assert math.isinf(f.peak(t, t + 3600))  # beyond the horizon nothing is known


def test_to_forecast_names_the_missing_quantile() -> None:
    with pytest.raises(KeyError, match=r"no quantile 0.99 \(has 0.5, 0.9\)"):
        pools.to_forecast(_resp({600: 1.0}), "0.99")
    assert math.isinf(pools.no_forecast(0.0).peak(0.0, 1.0))


def test_the_shipped_deployment_sets_only_known_flags_with_valid_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ROSE_CONTROLLER_* variable in manifests/controller names a flag and parses as it."""
    from pathlib import Path

    import yaml

    from elastic_controller.cli import ENV_PREFIX, build_parser

    root = Path(__file__).resolve().parents[3] / "manifests" / "controller"
    doc = yaml.safe_load((root / "deployment.yaml").read_text())
    env = doc["spec"]["template"]["spec"]["containers"][0]["env"]
    parser = build_parser()
    flags = {f"{ENV_PREFIX}{a.dest.upper()}" for a in parser._actions}
    for e in env:
        if e["name"].startswith(ENV_PREFIX):
            assert e["name"] in flags, f"{e['name']} names no flag of rose controller"
        monkeypatch.setenv(e["name"], str(e.get("value", "from-the-downward-api")))
    args = parser.parse_args([])
    assert (args.plan_interval, args.dwell, args.leader_elect) == (10.0, 300.0, True)


def test_bad_flag_values_are_refused_with_what_to_fix(capsys: pytest.CaptureFixture[str]) -> None:
    from elastic_controller.cli import build_parser, settings_from

    args = build_parser().parse_args(["--lease-duration=5", "--lease-renew=10s"])
    with pytest.raises(SystemExit, match="shorter than the lease duration"):
        settings_from(args)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--plan-interval=soon"])
    assert "not a duration: 'soon'" in capsys.readouterr().err
