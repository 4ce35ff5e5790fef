"""The forecaster: per-horizon scikit-learn quantile gradient boosting, split-conformal calibrated.

For every horizon ``h`` and quantile ``q`` a ``HistGradientBoostingRegressor(loss="quantile")``
learns the change ``z[i+h] - z[i]`` (see :mod:`predictor.features`). Calibration: the models
are first fit on the older part of the history and scored on the most recent slice
(``calibration_fraction``); the ``q``-quantile of those out-of-sample residuals is the
correction added to the ``q`` prediction (split-conformal), so the ``q``-quantile is exceeded
close to ``1 - q`` of the time. The models are then refit on the whole history and keep that
correction. Quantiles are sorted per row, so they never cross.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.pipeline import Pipeline
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from predictor.features import DAY, WEEK, FeatureSpec, Transform, build_features, targets
from predictor.series import FloatArray, Series


class NotEnoughHistory(ValueError):
    """The history is too short for a horizon; the message says how much is needed."""


@dataclass(frozen=True)
class ModelConfig:
    horizons: tuple[int, ...] = (600, 1800, 3600)  # seconds
    quantiles: tuple[float, ...] = (0.5, 0.9)
    day: int = DAY
    week: int = WEEK
    max_iter: int = 80
    learning_rate: float = 0.08
    max_leaf_nodes: int = 15
    min_samples_leaf: int = 30
    l2_regularization: float = 1.0
    calibration_fraction: float = 0.25
    # more (origin, target) pairs than this: keep every k-th origin, newest first (neighbouring
    # origins of 1-minute data are nearly duplicates; this bounds the fit time)
    max_train_rows: int = 10_000
    min_train_rows: int = 96
    seed: int = 0
    threads: int = 1  # OpenMP threads for a fit (1: predictable on a shared node)

    def __post_init__(self) -> None:
        if not self.horizons:
            raise ValueError("at least one horizon is needed")
        for q in self.quantiles:
            if not 0.0 < q < 1.0:
                raise ValueError(f"quantile {q} must be strictly between 0 and 1")
        if not 0.05 <= self.calibration_fraction <= 0.5:
            raise ValueError("calibration_fraction must be between 0.05 and 0.5")

    @property
    def all_quantiles(self) -> tuple[float, ...]:
        """The configured quantiles plus the median (the point forecast), sorted."""
        return tuple(sorted({*self.quantiles, 0.5}))


def _new_model(cfg: ModelConfig, q: float) -> Pipeline:
    return Pipeline(
        [
            (
                "gbm",
                HistGradientBoostingRegressor(
                    loss="quantile",
                    quantile=q,
                    max_iter=cfg.max_iter,
                    learning_rate=cfg.learning_rate,
                    max_leaf_nodes=cfg.max_leaf_nodes,
                    min_samples_leaf=cfg.min_samples_leaf,
                    l2_regularization=cfg.l2_regularization,
                    early_stopping=False,
                    random_state=cfg.seed,
                ),
            )
        ]
    )


@dataclass
class HorizonModel:
    horizon_steps: int
    models: dict[float, Pipeline]
    corrections: dict[float, float]
    columns: np.ndarray  # indices of the feature columns the models use (informative in training)
    alpha: float  # smoothing of the anchor level (1.0: the last value itself)
    flat_median: bool  # the held-out slice preferred the anchor itself as the median
    train_rows: int
    calibration_rows: int


@dataclass
class QuantileForecaster:
    """Fit on a :class:`Series` prefix; predict quantiles for any origins after it."""

    config: ModelConfig
    step: int = 0
    transform: Transform | None = None
    horizons: dict[int, HorizonModel] = field(default_factory=dict)
    fit_seconds: float = 0.0  # set by the caller that timed the fit (the model reads no clock)

    @property
    def spec(self) -> FeatureSpec:
        return FeatureSpec(step=self.step, day=self.config.day, week=self.config.week)

    def horizon_steps(self, horizon_seconds: int, step: int) -> int:
        if horizon_seconds % step:
            raise ValueError(
                f"horizon {horizon_seconds}s is not a whole number of steps of {step}s: "
                "pick horizons that are multiples of the series step"
            )
        return horizon_seconds // step

    def fit(self, series: Series, upto: int | None = None) -> QuantileForecaster:
        """Fit on ``series.values[: upto + 1]`` (default: all of it). No later value is read."""
        with threadpool_limits(limits=self.config.threads):
            return self._fit(series, upto)

    def _fit(self, series: Series, upto: int | None) -> QuantileForecaster:
        cfg = self.config
        last = len(series) - 1 if upto is None else upto
        y = series.values[: last + 1]
        if np.nanmin(y) < 0:
            raise ValueError("values must be >= 0 (serving demand); found negative values")
        self.step = series.step
        self.transform = Transform.fit(y)
        z = self.transform.forward(y)
        times = series.times[: last + 1].astype(np.float64)
        self.horizons = {}
        for hs in cfg.horizons:
            h = self.horizon_steps(hs, series.step)
            alpha = tune_anchor_alpha(z, h)
            level = ewm_level(z, alpha)
            x = np.column_stack([build_features(z, times, h, self.spec), z - level])
            tgt = targets(z, h) + z - level  # z[i+h] - level[i]
            rows = np.flatnonzero(~np.isnan(tgt))
            stride = -(-len(rows) // cfg.max_train_rows)
            rows = rows[::-1][::stride][::-1]
            if len(rows) < cfg.min_train_rows:
                raise NotEnoughHistory(
                    f"history too short for horizon {hs}s: {len(rows)} usable (origin, target) pairs, "
                    f"need at least {cfg.min_train_rows} (about {cfg.min_train_rows + h} observed steps "
                    f"of {series.step}s)"
                )
            n_cal = max(20, int(len(rows) * cfg.calibration_fraction))
            fit_rows, cal_rows = rows[: -n_cal - h], rows[-n_cal:]
            calibrate = len(fit_rows) >= cfg.min_train_rows // 2
            cols = informative_columns(x[fit_rows] if calibrate else x[rows])
            x = x[:, cols]
            corrections: dict[float, float] = {}
            models: dict[float, Pipeline] = {}
            flat_median = False
            for q in cfg.all_quantiles:
                if calibrate:
                    m = _new_model(cfg, q).fit(x[fit_rows], tgt[fit_rows])
                    raw = m.predict(x[cal_rows])
                    scores = tgt[cal_rows] - raw
                    corrections[q] = conformal_correction(np.asarray(scores, dtype=np.float64), q)
                    if q == 0.5:
                        # validation-based guard: keep the learnt median only where it beats the
                        # anchor's flat forecast on the held-out (most recent) slice, in the unit
                        actual = self.transform.inverse(level[cal_rows] + tgt[cal_rows])
                        learnt = self.transform.inverse(level[cal_rows] + raw + corrections[q])
                        flat = self.transform.inverse(level[cal_rows])
                        flat_median = float(np.sum(np.abs(actual - flat))) < float(np.sum(np.abs(actual - learnt)))
                else:
                    corrections[q] = 0.0
                models[q] = _new_model(cfg, q).fit(x[rows], tgt[rows])
            self.horizons[hs] = HorizonModel(h, models, corrections, cols, alpha, flat_median, len(rows), len(cal_rows))
        return self

    def predict(self, series: Series, origins: np.ndarray | None = None) -> dict[int, FloatArray]:
        """Quantile forecasts (in the series' unit) per horizon: array ``[len(origins), n_quantiles]``.

        Features at origin ``i`` read ``series.values[: i + 1]`` only. Origins whose own value is
        a gap get NaN rows (the forecast is anchored on the current level).
        """
        with threadpool_limits(limits=self.config.threads):
            return self._predict(series, origins)

    def _predict(self, series: Series, origins: np.ndarray | None) -> dict[int, FloatArray]:
        if self.transform is None:
            raise RuntimeError("fit the forecaster before predicting")
        if series.step != self.step:
            raise ValueError(f"series step {series.step}s differs from the fitted step {self.step}s")
        idx = np.arange(len(series)) if origins is None else np.asarray(origins, dtype=np.int64)
        if len(idx) == 0:
            return {hs: np.empty((0, len(self.config.all_quantiles))) for hs in self.horizons}
        lo = max(0, int(idx.min()) - self._lookback())
        hi = int(idx.max()) + 1
        y = series.values[lo:hi]
        z = self.transform.forward(y)
        times = series.times[lo:hi].astype(np.float64)
        rel = idx - lo
        out: dict[int, FloatArray] = {}
        qs = self.config.all_quantiles
        for hs, hm in self.horizons.items():
            level = ewm_level(z, hm.alpha)
            x = np.column_stack([build_features(z, times, hm.horizon_steps, self.spec), z - level])
            x = x[rel][:, hm.columns]
            cols = [
                np.zeros(len(x)) if q == 0.5 and hm.flat_median else hm.models[q].predict(x) + hm.corrections[q]
                for q in qs
            ]
            delta = np.sort(np.column_stack(cols), axis=1)
            pred = self.transform.inverse(level[rel][:, None] + delta)
            pred[np.isnan(z[rel])] = np.nan
            out[hs] = pred
        return out

    def _lookback(self) -> int:
        """Steps of history the features read before an origin."""
        spec = self.spec
        need = [*spec.lag_steps(), *spec.window_steps(), *[p + 2 for p in spec.periods()]]
        return max(need) + 2

    def describe(self) -> dict[str, object]:
        return {
            "step_seconds": self.step,
            "offset": None if self.transform is None else self.transform.offset,
            "fit_seconds": round(self.fit_seconds, 4),
            "horizons": {
                str(hs): {
                    "train_rows": hm.train_rows,
                    "calibration_rows": hm.calibration_rows,
                    "anchor_alpha": hm.alpha,
                    "flat_median": hm.flat_median,
                    "corrections": {str(q): round(c, 5) for q, c in hm.corrections.items()},
                }
                for hs, hm in self.horizons.items()
            },
        }


ANCHOR_ALPHAS = (1.0, 0.7, 0.5, 0.3, 0.2, 0.1)


def ewm_level(z: FloatArray, alpha: float) -> FloatArray:
    """Exponentially weighted level of ``z`` (gaps carried over); ``alpha=1`` is ``z`` itself."""
    if alpha >= 1.0:
        return z.copy()
    out: FloatArray = pd.Series(z).ewm(alpha=alpha, adjust=False, ignore_na=True).mean().to_numpy(np.float64)
    return out


def tune_anchor_alpha(z: FloatArray, horizon: int) -> float:
    """The level smoothing whose flat forecast ``h`` steps ahead has the lowest MAE on this history.

    The model then learns the change from that level, so its default (a zero change) is already
    the best of persistence and the exponentially weighted mean, and noise at the origin does
    not propagate into the forecast.
    """
    future = np.concatenate([z[horizon:], np.full(horizon, np.nan)])
    best, best_err = 1.0, np.inf
    for a in ANCHOR_ALPHAS:
        err_v = np.abs(future - ewm_level(z, a))
        ok = ~np.isnan(err_v) & ~np.isnan(z)
        if not ok.any():
            continue
        err = float(np.mean(err_v[ok]))
        if err < best_err:
            best, best_err = a, err
    return best


def conformal_correction(scores: FloatArray, q: float) -> float:
    """Split-conformal: the finite-sample ``q``-quantile of the held-out residuals (conservative)."""
    if q >= 0.5:
        level = min(1.0, q * (1 + 1 / len(scores)))
        return float(np.quantile(scores, level, method="higher"))
    return float(np.quantile(scores, q, method="lower"))


def informative_columns(x: FloatArray) -> np.ndarray:
    """Columns observed in at least a quarter of the rows, with at least two distinct values.

    A feature that only just became available (the weekly lag after seven days of history) would
    otherwise be learnt from a handful of recent rows and then drive every forecast.
    """
    keep = []
    for j in range(x.shape[1]):
        col = x[:, j]
        col = col[~np.isnan(col)]
        if len(col) >= max(2, 0.25 * x.shape[0]) and float(col.max()) > float(col.min()):
            keep.append(j)
    return np.asarray(keep, dtype=np.int64)


def quantile_key(q: float) -> str:
    """0.9 → ``"0.9"``: the key used in the wire format."""
    s = f"{q:.4f}".rstrip("0").rstrip(".")
    return s if not math.isnan(q) else "nan"
