"""The forecasting service: per pool, ingest → bounded history → periodic retrain → cached forecast.

:func:`build_response` is the pure decision (forecast or safe upper bound, and the ``stale``
flag) and :func:`plan_refresh` the pure order of one cycle's work (every pool that can answer
answers before any fit); :class:`PredictorService` is the thin loop around them. A request only
reads the cached forecast of its pool, so it never waits for Prometheus or a fit.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from predictor.ingest import HistoryBuffer, IngestError
from predictor.metrics import PredictorMetrics
from predictor.model import ModelConfig, NotEnoughHistory, QuantileForecaster, quantile_key
from predictor.risk import NotEnoughWindows, RiskParams, WidthModels, fit_risk, forecast_now, monotone_in_risk
from predictor.series import Series, format_duration
from predictor.store import ModelStore, UntrustedModel, runtime_mismatch
from rose_common.forecast_api import ForecastPoint, ForecastResponse

log = logging.getLogger("rose.predictor")


class PoolConfig(BaseModel):
    """One GPU pool: the PromQL whose value is forecast, its unit, and its capacity (the safe bound)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$", max_length=63)
    query: str = Field(min_length=1)
    unit: str = "gpus"
    capacity: float | None = Field(default=None, ge=0)
    # demand one GPU serves: turns the window-max bounds into GPUs (``gpus_needed``)
    capacity_per_gpu: float | None = Field(default=None, gt=0)


class PoolsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pools: list[PoolConfig] = Field(min_length=1)


def load_pools(path: Path) -> list[PoolConfig]:
    """Read the pools file (YAML); errors name the file and the field to fix."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"cannot read pools file {path}: {e}") from None
    try:
        pools = PoolsFile.model_validate(raw).pools
    except ValidationError as e:
        raise ValueError(f"pools file {path} is invalid: {e}") from None
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise ValueError(f"pools file {path}: duplicate pool names in {names}")
    return pools


class Source(Protocol):
    def range(self, query: str, start: int, end: int, step: int) -> Series: ...


class NoForecast(RuntimeError):
    """Neither data nor a configured capacity: there is no honest answer to give."""


RiskModels = dict[tuple[int, float], RiskParams]  # (horizon seconds, risk) → fitted window-max model
RISK_WARMUP_STEPS = 1440  # online calibration replayed over this much recent history per forecast


def _window_fields(pool: PoolConfig, bounds: dict[float, float]) -> dict[str, object]:
    """``window_max`` (and ``gpus_needed`` with a capacity per GPU) for a point; empty without risks."""
    if not bounds:
        return {}
    out: dict[str, object] = {"window_max": {quantile_key(r): b for r, b in bounds.items()}}
    if pool.capacity_per_gpu is not None:
        cpg = pool.capacity_per_gpu
        out["gpus_needed"] = {quantile_key(r): math.ceil(b / cpg - 1e-9) for r, b in bounds.items()}
    return out


def _window_bounds(series: Series, origin: int, h: int, risk_models: RiskModels) -> dict[float, float]:
    y = series.values[: origin + 1]
    return monotone_in_risk(
        {
            r: forecast_now(p, y, RISK_WARMUP_STEPS, series.start)
            for (hs, r), p in sorted(risk_models.items())
            if hs == h
        }
    )


def build_response(
    pool: PoolConfig,
    series: Series | None,
    model: QuantileForecaster | None,
    version: str,
    now: float,
    horizons: list[int],
    quantiles: tuple[float, ...],
    max_data_age: float,
    risk_models: RiskModels | None = None,
    risks: tuple[float, ...] = (),
) -> ForecastResponse:
    """The forecast for ``pool`` at ``now``, or an explicit stale upper bound.

    Not stale: the model's quantiles from the newest observation, at ``last_obs + horizon``.
    Stale (no data, data older than ``max_data_age``, or no fitted model yet): every quantile
    is the pool's ``capacity`` or, without one, the maximum seen in the retained history.
    With ``risks``, each point also carries the window-max bound per risk (``risk_models``; a
    missing or unusable one makes the response stale, with the same safe bound).
    """
    last_t: int | None = None
    current: float | None = None
    origin: int | None = None
    if series is not None:
        idx = np.flatnonzero(~np.isnan(series.values))
        if len(idx):
            origin = int(idx[-1])
            last_t = series.start + origin * series.step
            current = float(series.values[origin])
    age = None if last_t is None else max(0.0, now - last_t)
    stale = model is None or age is None or age > max_data_age
    keys = [quantile_key(q) for q in quantiles]
    points: list[ForecastPoint] = []
    if not stale and model is not None and series is not None and origin is not None and last_t is not None:
        preds = model.predict(series, np.asarray([origin]))
        for h in horizons:
            row = preds[h][0]
            bounds = _window_bounds(series, origin, h, risk_models or {})
            if np.any(np.isnan(row)) or len(bounds) != len(risks) or any(math.isnan(b) for b in bounds.values()):
                stale = True
                break
            points.append(
                ForecastPoint(
                    horizon_seconds=h,
                    timestamp=datetime.fromtimestamp(last_t + h, UTC),
                    quantiles={k: float(v) for k, v in zip(keys, row.tolist(), strict=True)},
                    **_window_fields(pool, bounds),  # type: ignore[arg-type]
                )
            )
    if stale:
        if pool.capacity is not None:
            bound = pool.capacity
        elif series is not None and np.any(~np.isnan(series.values)):
            bound = float(np.nanmax(series.values))
        else:
            raise NoForecast(f"pool {pool.name}: no data yet and no capacity configured for a safe bound")
        points = [
            ForecastPoint(
                horizon_seconds=h,
                timestamp=datetime.fromtimestamp(now + h, UTC),
                quantiles=dict.fromkeys(keys, bound),
                **_window_fields(pool, dict.fromkeys(risks, bound)),  # type: ignore[arg-type]
            )
            for h in horizons
        ]
    return ForecastResponse(
        pool=pool.name,
        unit=pool.unit,
        model_version=version,
        generated_at=datetime.fromtimestamp(now, UTC),
        last_observation_at=None if last_t is None else datetime.fromtimestamp(last_t, UTC),
        data_age_seconds=age,
        stale=stale,
        current=current,
        points=points,
    )


Work = Literal["answer", "risks", "fit"]


@dataclass(frozen=True)
class PoolView:
    """What :func:`plan_refresh` knows of one pool after this cycle's ingest."""

    name: str
    has_series: bool  # any retained history (a fit needs it)
    has_model: bool
    model_age: float  # seconds since its model was fitted (0 without one)
    loaded: bool  # the model is the persisted one loaded at start, not refit yet
    needs_risks: bool  # risks are served and the model has no window-max bounds fitted
    answered: bool  # a forecast was computed before, or a fit was tried


def plan_refresh(pools: Sequence[PoolView], retrain_interval: float) -> list[tuple[str, Work]]:
    """The order of one refresh cycle's work (each item ends with the pool's forecast recomputed).

    1. ``answer``: every pool that can answer without a fit (it has a model, whatever its age, or
       it was answered before, or it has no data to fit on), in pools-file order;
    2. ``risks``: a model without window-max bounds gets them (cheap beside a fit), unless it is
       due for a refit anyway (a loaded model gets them even then: they let it answer first);
    3. ``fit``: pools without a model first (they cannot answer otherwise), then due refits,
       the oldest model first.

    So no pool's first forecast waits for another pool's fit, and a model's age decides when it
    is refit, never whether it answers (the service refuses a model older than
    ``Settings.max_model_age`` when loading it, so such a pool is one without a model).
    """
    answer: list[tuple[str, Work]] = [
        (p.name, "answer") for p in pools if p.has_model or p.answered or not p.has_series
    ]
    fits = [p for p in pools if p.has_series]
    due = [p for p in fits if p.has_model and p.model_age >= retrain_interval]
    risks: list[tuple[str, Work]] = [
        (p.name, "risks") for p in fits if p.has_model and p.needs_risks and (p.loaded or p not in due)
    ]
    refits = [p for p in fits if not p.has_model] + sorted(due, key=lambda p: -p.model_age)
    fit: list[tuple[str, Work]] = [(p.name, "fit") for p in refits]
    return answer + risks + fit


@dataclass
class Settings:
    step: int = 60
    history: int = 14 * 86400  # seconds kept and trained on
    retrain_interval: float = 3600.0
    refresh_interval: float = 30.0
    max_data_age: float = 300.0
    max_model_age: float = 7 * 86400.0  # a persisted model older than this is not loaded (0: any age)
    risks: tuple[float, ...] = ()  # target risks served as window-max bounds (empty: none)
    model: ModelConfig = field(default_factory=ModelConfig)


@dataclass
class PoolState:
    config: PoolConfig
    buffer: HistoryBuffer
    model: QuantileForecaster | None = None
    risk_models: RiskModels = field(default_factory=dict)
    version: str = "none"
    fitted_at: float = 0.0
    loaded: bool = False  # the model is the persisted one loaded at start, not refit yet
    tried_fit: bool = False
    response: ForecastResponse | None = None
    error: str | None = None


Fitter = Callable[[ModelConfig, Series], QuantileForecaster]


def fit_model(config: ModelConfig, series: Series) -> QuantileForecaster:
    """The service's fitter: a :class:`QuantileForecaster` fitted on the pool's retained history."""
    return QuantileForecaster(config).fit(series)


class PredictorService:
    def __init__(
        self,
        pools: list[PoolConfig],
        source: Source,
        settings: Settings,
        store: ModelStore | None = None,
        clock: Callable[[], float] = time.time,
        fitter: Fitter = fit_model,
    ) -> None:
        self.settings = settings
        self.source = source
        self.store = store
        self.clock = clock
        self.fitter = fitter
        capacity = settings.history // settings.step + 1
        self.pools = {p.name: PoolState(p, HistoryBuffer(settings.step, capacity)) for p in pools}
        self.metrics = PredictorMetrics(
            [p.name for p in pools], list(settings.model.horizons), list(settings.model.all_quantiles), settings.risks
        )
        self._lock = threading.Lock()
        if store is not None:
            for st in self.pools.values():
                self._load_persisted(st)

    def _load_persisted(self, st: PoolState) -> None:
        assert self.store is not None
        try:
            found = self.store.load_latest(st.config.name)
        except UntrustedModel as e:
            self.metrics.fits.labels(st.config.name, "untrusted").inc()
            log.warning("persisted model refused; will refit", extra={"pool": st.config.name, "err": str(e)})
            return
        except Exception as e:
            log.warning("cannot load persisted model", extra={"pool": st.config.name, "err": str(e)})
            return
        if found is None:
            return
        version, model, meta = found
        name = st.config.name
        fitted_at = meta.get("fitted_at")
        age = self.clock() - float(fitted_at) if isinstance(fitted_at, int | float) else math.inf
        why = self._mismatch(model, meta)
        limit = self.settings.max_model_age
        if why is None and limit > 0 and age > limit:
            self.metrics.fits.labels(name, "expired").inc()
            why = f"older than --max-model-age {format_duration(int(limit))}: fitted {age:.0f}s ago"
        if why is not None:
            log.info("persisted model not used; will refit", extra={"pool": name, "version": version, "why": why})
            return
        st.model, st.version, st.loaded = model, version, True
        st.fitted_at = float(fitted_at) if isinstance(fitted_at, int | float) else 0.0
        log.info("loaded persisted model", extra={"pool": name, "version": version, "ageSeconds": round(age, 1)})

    def _mismatch(self, model: QuantileForecaster, meta: dict[str, Any]) -> str | None:
        """Why a loaded model cannot serve under these settings (None: it can)."""
        mismatch = runtime_mismatch(meta)
        if mismatch is not None:
            return f"saved under other library versions: {mismatch}"
        cfg = self.settings.model
        if (
            model.step != self.settings.step
            or sorted(model.horizons) != sorted(cfg.horizons)
            or model.config.all_quantiles != cfg.all_quantiles
            or (model.config.day, model.config.week) != (cfg.day, cfg.week)
        ):
            return "it does not match the settings (step, horizons, quantiles or seasons)"
        return None

    def refresh(self) -> None:
        """One cycle: ingest every pool, then the work :func:`plan_refresh` orders (answers first)."""
        series = {name: self._ingest(st) for name, st in self.pools.items()}
        now = self.clock()
        views = [self._view(st, series[name] is not None, now) for name, st in self.pools.items()]
        for name, work in plan_refresh(views, self.settings.retrain_interval):
            st, sr = self.pools[name], series[name]
            if work == "risks" and sr is not None:
                st.risk_models = self._fit_risks(name, sr)
            elif work == "fit" and sr is not None:
                st.tried_fit = True
                self._fit(st, sr, self.clock())
            self._answer(st, sr)

    def _view(self, st: PoolState, has_series: bool, now: float) -> PoolView:
        return PoolView(
            name=st.config.name,
            has_series=has_series,
            has_model=st.model is not None,
            model_age=max(0.0, now - st.fitted_at) if st.model is not None else 0.0,
            loaded=st.loaded,
            needs_risks=bool(self.settings.risks) and not st.risk_models,
            answered=st.response is not None or st.tried_fit,
        )

    def _ingest(self, st: PoolState) -> Series | None:
        """Merge the newest range of the pool's query into its buffer; the retained series (None: no data)."""
        s = self.settings
        name = st.config.name
        now = self.clock()
        end = int(now) - int(now) % s.step
        start = end - s.history
        if st.buffer.end is not None:
            start = max(start, st.buffer.end - 5 * s.step)  # re-read the tail: late samples
        try:
            st.buffer.merge(self.source.range(st.config.query, start, end, s.step))
            self.metrics.ingests.labels(name, "ok").inc()
            st.error = None
        except IngestError as e:
            self.metrics.ingests.labels(name, "error").inc()
            st.error = str(e)
            log.warning("ingest failed", extra={"pool": name, "err": str(e)})
        return st.buffer.series(name)

    def _answer(self, st: PoolState, series: Series | None) -> None:
        """Recompute the pool's cached forecast from its retained series and current model."""
        s = self.settings
        now = self.clock()
        try:
            resp = build_response(
                st.config,
                series,
                st.model,
                st.version,
                now,
                list(s.model.horizons),
                s.model.all_quantiles,
                s.max_data_age,
                st.risk_models,
                s.risks,
            )
        except NoForecast as e:
            resp = None
            st.error = str(e)
        with self._lock:
            first = st.response is None
            st.response = resp
        if first and st.loaded and resp is not None:
            log.info(
                "serving persisted model until its refit",
                extra={
                    "pool": st.config.name,
                    "version": st.version,
                    "ageSeconds": round(now - st.fitted_at, 1),
                    "stale": resp.stale,
                },
            )
        self._export(st, resp, now)

    def _fit(self, st: PoolState, series: Series, now: float) -> None:
        name = st.config.name
        try:
            t0 = time.perf_counter()
            model = self.fitter(self.settings.model, series)
            model.fit_seconds = time.perf_counter() - t0
        except NotEnoughHistory as e:
            self.metrics.fits.labels(name, "skipped").inc()
            log.info("not enough history to fit yet", extra={"pool": name, "err": str(e)})
            return
        except Exception as e:
            self.metrics.fits.labels(name, "error").inc()
            log.error("fit failed", extra={"pool": name, "err": repr(e)})
            return
        st.risk_models = self._fit_risks(name, series)
        version = f"{name}-unsaved-{int(now)}"
        if self.store is not None:
            meta = {"pool": name, "fitted_at": now, "points": len(series), **model.describe()}
            try:
                version = self.store.save(name, model, meta, now)
            except OSError as e:
                log.error("cannot persist model", extra={"pool": name, "err": str(e)})
        st.model, st.version, st.fitted_at, st.loaded = model, version, now, False
        self.metrics.fits.labels(name, "ok").inc()
        self.metrics.last_fit.labels(name).set(now)
        self.metrics.fit_duration.labels(name).set(model.fit_seconds)
        log.info("model fitted", extra={"pool": name, "version": version, "seconds": round(model.fit_seconds, 3)})

    def _fit_risks(self, name: str, series: Series) -> RiskModels:
        out: RiskModels = {}
        widths = WidthModels()  # the risks of a horizon share its width models
        for hs in self.settings.model.horizons:
            for r in self.settings.risks:
                try:
                    out[(hs, r)] = fit_risk(
                        series.values, hs // series.step, r, series.step, len(series) - 1, series.start, widths=widths
                    )
                except NotEnoughWindows as e:
                    log.info(
                        "not enough history for a window-max bound yet", extra={"pool": name, "risk": r, "err": str(e)}
                    )
        return out

    def _export(self, st: PoolState, resp: ForecastResponse | None, now: float) -> None:
        name = st.config.name
        m = self.metrics
        m.model_age.labels(name).set(max(0.0, now - st.fitted_at) if st.model is not None else 0.0)
        m.model_loaded.labels(name).set(1 if st.loaded else 0)
        if resp is None:
            m.stale.labels(name).set(1)
            return
        m.stale.labels(name).set(1 if resp.stale else 0)
        m.data_age.labels(name).set(resp.data_age_seconds or 0.0)
        m.current.labels(name).set(resp.current or 0.0)
        for p in resp.points:
            for q, v in p.quantiles.items():
                m.forecast.labels(name, format_duration(p.horizon_seconds), q).set(v)
            for r, v in (p.window_max or {}).items():
                m.window_max.labels(name, format_duration(p.horizon_seconds), r).set(v)

    def forecast(self, pool: str) -> ForecastResponse | None:
        with self._lock:
            st = self.pools[pool]
            return st.response

    def run(self, stop: threading.Event) -> None:
        """Refresh every ``refresh_interval`` seconds until ``stop`` is set."""
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                self.refresh()
            except Exception as e:  # never let one bad cycle end the loop
                log.error("refresh failed", extra={"err": repr(e)})
            stop.wait(max(0.0, self.settings.refresh_interval - (time.monotonic() - t0)))
