"""The planner's pools: capacity from nodes and ResourceSlices, forecasts from the predictor's reply.

I/O boundary: none. :func:`capacities` counts the physical GPUs the ROSE driver publishes on
the nodes of each pool (label ``rose.io/gpu-pool``; each physical GPU appears once as a serving
and once as a lendable device, so the lendable devices count them). :func:`to_forecast` turns a
:class:`~rose_common.forecast_api.ForecastResponse` into the planner's step function at the
operator's quantile, conservatively: each step holds the larger of the two points around it.
:func:`to_forecast` with the operator's ``risk`` uses the
GPUs serving may need over each window at that risk (``gpus_needed``, issue 14 §3) when every
point carries it: a window bound covers everything from now to its horizon, so each step holds
the tightest window that covers it. :func:`no_forecast` is what a pool without a fresh forecast
gets: an empty horizon; the controller also marks such a pool ``frozen``, and the planner makes no
grants and no planned reclaims where the forecast does not cover the next plan interval. The
:class:`Forecast` also keeps the reply's own points, reduced as the extender reduces them
(``rose_common.forecast_risk.serving_points``): the planner judges a new lent claim on those, by the
extender's reading (``rose_common.lending``), so the two agree on it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from elastic_controller.planner import Forecast
from rose_common import forecast_risk, names, quantity
from rose_common.forecast_api import ForecastResponse
from rose_common.kube import objects

STEP_S = 60.0


def _role(device: Mapping[str, Any]) -> str:
    attrs = device.get("attributes") or {}
    for key in (names.ATTR_ROLE, f"{names.DRIVER_NAME}/{names.ATTR_ROLE}"):
        value = attrs.get(key)
        if isinstance(value, Mapping) and isinstance(value.get("string"), str):
            return str(value["string"])
    return ""


def lendable_on(sl: Mapping[str, Any]) -> tuple[str, int] | None:
    """``(node name, lendable devices)`` of one of the ROSE driver's ResourceSlices; None for another driver's."""
    spec = objects.spec(sl)
    if spec.get("driver") != names.DRIVER_NAME:
        return None
    return str(spec.get("nodeName", "")), sum(1 for d in spec.get("devices") or [] if _role(d) == names.ROLE_LENDABLE)


def lendable_devices(sl: Mapping[str, Any]) -> tuple[str, tuple[str, ...]] | None:
    """``(node name, lendable device names)`` of one of the ROSE driver's slices; None for another driver's."""
    spec = objects.spec(sl)
    if spec.get("driver") != names.DRIVER_NAME:
        return None
    devs = tuple(sorted(str(d.get("name", "")) for d in spec.get("devices") or [] if _role(d) == names.ROLE_LENDABLE))
    return str(spec.get("nodeName", "")), devs


def lendable_memory(sl: Mapping[str, Any]) -> int:
    """The most device memory (bytes) of one lendable device of the ROSE driver's slice ``sl``;
    0 for another driver's slice or when no device publishes its ``memory`` capacity."""
    if objects.spec(sl).get("driver") != names.DRIVER_NAME:
        return 0
    best = 0
    for d in objects.spec(sl).get("devices") or []:
        cap = (d.get("capacity") or {}).get(names.CAPACITY_MEMORY)
        if _role(d) != names.ROLE_LENDABLE or not isinstance(cap, Mapping):
            continue
        try:
            best = max(best, quantity.to_int(str(cap.get("value", ""))))
        except ValueError:
            continue
    return best


def serving_held(sl: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    """``(pool, device)`` of each lendable device of the ROSE driver's slice ``sl`` that carries the
    driver's ``rose.io/serving-holds`` taint (serving's claim is allocated on its GPU); empty for
    another driver's slice. The pool is the slice's ``spec.pool.name``, as a claim's allocation names it."""
    spec = objects.spec(sl)
    if spec.get("driver") != names.DRIVER_NAME:
        return frozenset()
    pool = str((spec.get("pool") or {}).get("name") or spec.get("nodeName") or "")
    return frozenset(
        (pool, str(d.get("name", "")))
        for d in spec.get("devices") or []
        if _role(d) == names.ROLE_LENDABLE
        and any(t.get("key") == names.TAINT_SERVING_HOLDS for t in d.get("taints") or [] if isinstance(t, Mapping))
    )


def lent_gpus(node: Mapping[str, Any]) -> frozenset[int] | None:
    """The GPU indexes with a lent claim prepared on ``node``, as its driver publishes them
    (``rose.io/lent-gpus``); None when the node carries no such annotation (no driver facts) or
    it is unreadable: nothing can be judged unprepared there."""
    raw = objects.annotations(node).get(names.ANNOTATION_LENT)
    if raw is None:
        return None
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        return None
    return frozenset(int(p) for p in parts)


def sum_capacities(pool_of: Mapping[str, str], per_slice: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Physical GPUs per pool from each node's pool and each slice's ``(node, lendable devices)``."""
    out: Counter[str] = Counter({p: 0 for p in pool_of.values() if p})
    for node, n in per_slice:
        pool = pool_of.get(node, "")
        if pool:
            out[pool] += n
    return dict(out)


def capacities(nodes: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Physical GPUs per pool: lendable devices of the driver's slices on each pool's nodes."""
    pool_of = {objects.name(n): objects.labels(n).get(names.LABEL_POOL, "") for n in nodes}
    return sum_capacities(pool_of, (x for x in map(lendable_on, slices) if x is not None))


def no_forecast(now: float) -> Forecast:
    return Forecast(start=now, step=STEP_S, upper=())


def _value(quantiles: Mapping[str, float], quantile: str) -> float:
    if quantile in quantiles:
        return float(quantiles[quantile])
    want = float(quantile)
    for k, v in quantiles.items():
        if math.isclose(float(k), want):
            return float(v)
    raise KeyError(f"forecast has no quantile {quantile} (has {', '.join(sorted(quantiles))})")


def _window_steps(windows: tuple[tuple[int, float], ...], step_s: float) -> tuple[float, ...]:
    """Step ``i`` (``[i*step, (i+1)*step)``) holds the bound of the shortest window reaching its end."""
    steps = []
    for i in range(max(1, math.ceil(windows[-1][0] / step_s))):
        end = (i + 1) * step_s
        steps.append(next((v for h, v in windows if h >= end), windows[-1][1]))
    return tuple(steps)


def to_forecast(resp: ForecastResponse, quantile: str, step_s: float = STEP_S, risk: str = "") -> Forecast:
    """The planner's step function from ``generated_at`` to the last horizon.

    At ``risk`` (a wire key, e.g. "0.01") when every point carries its window bound: see
    :func:`_window_steps`. Otherwise at ``quantile``: a step between two horizons holds the larger
    of the two (``current`` counts as horizon 0); a reply without the quantile raises
    ``KeyError`` naming the quantiles it has."""
    start = resp.generated_at.timestamp()
    # the reply's points as the extender reduces them: a new lent claim is judged on these (rose_common.lending)
    own = tuple((float(h), v) for h, v in forecast_risk.serving_points(resp, quantile, risk)[0])
    windows = forecast_risk.at_risk(resp, risk)
    if windows:
        return Forecast(start, step_s, _window_steps(windows, step_s), quantile=f"at risk {risk}", points=own)
    points = sorted((p.horizon_seconds, _value(p.quantiles, quantile)) for p in resp.points)
    if resp.current is not None:
        points.insert(0, (0, float(resp.current)))
    if not points:
        return no_forecast(resp.generated_at.timestamp())
    horizon = points[-1][0]
    upper = []
    for i in range(max(1, math.ceil(horizon / step_s))):
        t0, t1 = i * step_s, (i + 1) * step_s
        before = [v for h, v in points if h <= t0]
        after = [v for h, v in points if h >= t1] or [points[-1][1]]
        inside = [v for h, v in points if t0 < h < t1]
        upper.append(max(([before[-1]] if before else []) + [after[0]] + inside))
    return Forecast(start=start, step=step_s, upper=tuple(upper), quantile=f"p{float(quantile) * 100:g}", points=own)
