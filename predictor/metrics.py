"""The predictor's Prometheus metrics (prefix ``rose_``, base units, every series initialised)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from predictor.model import quantile_key
from predictor.series import format_duration


class PredictorMetrics:
    """One registry per service instance (tests run several side by side)."""

    def __init__(
        self, pools: list[str], horizons: list[int], quantiles: list[float], risks: tuple[float, ...] = ()
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.forecast = Gauge(
            "rose_forecast_demand",
            "Forecast serving demand per pool, horizon and quantile (in the pool's unit, e.g. GPUs)",
            ["pool", "horizon", "quantile"],
            registry=r,
        )
        self.window_max = Gauge(
            "rose_forecast_window_max",
            "Upper bound on the maximum demand over [now, now + horizon] at a target risk (pool's unit)",
            ["pool", "horizon", "risk"],
            registry=r,
        )
        self.stale = Gauge(
            "rose_forecast_stale", "1 when the pool's forecast is a safe upper bound", ["pool"], registry=r
        )
        self.data_age = Gauge(
            "rose_forecast_data_age_seconds", "Age of the newest observation at the last refresh", ["pool"], registry=r
        )
        self.current = Gauge("rose_forecast_current", "The newest observed value per pool", ["pool"], registry=r)
        self.last_fit = Gauge(
            "rose_forecast_last_fit_timestamp_seconds", "When the pool's model was last fitted", ["pool"], registry=r
        )
        self.fit_duration = Gauge(
            "rose_forecast_fit_duration_seconds", "Duration of the pool's last fit", ["pool"], registry=r
        )
        self.model_age = Gauge(
            "rose_forecast_model_age_seconds",
            "Seconds since the pool's served model was fitted (0 without a model)",
            ["pool"],
            registry=r,
        )
        self.model_loaded = Gauge(
            "rose_forecast_model_loaded",
            "1 while the pool's served model is the persisted one loaded at start, not refit yet",
            ["pool"],
            registry=r,
        )
        self.fits = Counter("rose_forecast_fits_total", "Model fits by result", ["pool", "result"], registry=r)
        self.ingests = Counter(
            "rose_forecast_ingest_total", "Prometheus range queries by result", ["pool", "result"], registry=r
        )
        self.requests = Counter("rose_forecast_requests_total", "HTTP requests by code", ["code"], registry=r)
        self.request_seconds = Histogram(
            "rose_forecast_request_duration_seconds",
            "Time to answer GET /v1/forecast",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1),
            registry=r,
        )
        for p in pools:
            for h in horizons:
                for q in quantiles:
                    self.forecast.labels(p, format_duration(h), quantile_key(q)).set(0)
                for rk in risks:
                    self.window_max.labels(p, format_duration(h), quantile_key(rk)).set(0)
            self.stale.labels(p).set(1)
            self.data_age.labels(p).set(0)
            self.current.labels(p).set(0)
            self.last_fit.labels(p).set(0)
            self.fit_duration.labels(p).set(0)
            self.model_age.labels(p).set(0)
            self.model_loaded.labels(p).set(0)
            for res in ("ok", "error", "skipped", "untrusted", "expired"):
                self.fits.labels(p, res)
            for res in ("ok", "error"):
                self.ingests.labels(p, res)
        for code in ("200", "400", "404", "503"):
            self.requests.labels(code)
