"""``--planner=off`` (reactive only): the controller writes no planned suspend requests when the
forecast rises, still grows on an idle forecast, and the flag parses (with its env twin)."""

from __future__ import annotations

import pytest

from elastic_controller.cli import build_parser, settings_from
from elastic_controller.controller import Controller, ControllerSettings, without_reclaims
from elastic_controller.metrics import ControllerMetrics
from elastic_controller.planner import JobTarget, Plan, Reclaim
from rose_common.informer import ADDED
from tests.support.controller_fakes import NOW, RAW_JOB, Forecasts, Recorder, drain, inventory, running_pod


def _reactive(planned: bool) -> tuple[Controller, Recorder]:
    api = Recorder()
    settings = ControllerSettings(planned=planned)
    return Controller(api, Forecasts(0.0), inventory, ControllerMetrics(), settings, clock=lambda: NOW), api


@pytest.mark.parametrize("planned", [True, False])
def test_forecast_rise_suspends_only_with_the_planner_on(planned: bool) -> None:
    ctl, api = _reactive(planned)
    ctl.on_job_list([RAW_JOB])
    ctl.plan_once()
    drain(ctl)
    assert len(api.names("create")) == 4  # grows either way
    for i, body in enumerate(api.created):
        ctl.on_pod_event(ADDED, running_pod(body, f"uid-{i}"))
    drain(ctl)
    ctl.forecasts = Forecasts(need=8.0)
    ctl.plan_once()
    drain(ctl)
    assert len(api.names("request")) == (4 if planned else 0)
    assert ctl.metrics.reclaims.labels("planned")._value.get() == (4 if planned else 0)
    assert api.names("status")[-1] == (0 if planned else 4)
    assert ("PlannedGangSuspend" in api.names("event")) == planned
    assert "delete" not in dict(api.calls)


def test_without_reclaims_keeps_the_other_decisions() -> None:
    reasons = ("PlannedShrink: a-w2 in p", "Shrink: a-w9 removed, maxGPUs is 2", "PlannedShrink: a-w3")
    t = JobTarget("rl/a", 2, suspend=("a-w2", "a-w9"), remove=("a-w3",), reasons=reasons)
    p = Plan(0.0, {"rl/a": t}, (Reclaim("p", "rl/a", "shrink", ("a-w2", "a-w3")),), {"p": 2})
    out = without_reclaims(p, {"rl/a": 2}).targets["rl/a"]
    assert (out.suspend, out.remove, out.active_gpus) == (("a-w9",), (), 6)
    assert out.reasons == ("Shrink: a-w9 removed, maxGPUs is 2",)


def test_planner_flag_parses_and_refuses_other_values(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert settings_from(build_parser().parse_args([])).planned is True
    assert settings_from(build_parser().parse_args(["--planner=off"])).planned is False
    monkeypatch.setenv("ROSE_CONTROLLER_PLANNER", "off")
    assert settings_from(build_parser().parse_args([])).planned is False
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--planner=maybe"])
    assert "invalid choice: 'maybe'" in capsys.readouterr().err
