"""Rolling-origin backtest of the model against the baselines, with no look-ahead.

The first ``initial_train`` steps are history only. From there the model is refit every
``refit_every`` steps on everything seen so far (``series.values[: r + 1]`` at refit origin
``r``) and forecasts every origin until the next refit; each forecast reads only values up to
its own origin. Every method is scored on the same origins: those whose current value and
target value are both observed. WAPE = sum|actual - forecast| / sum|actual|; MASE = mean absolute
error / the in-sample mean absolute one-step change of the initial history; coverage = the
share of targets at or below the forecast ``quantile``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from predictor import baselines
from predictor.features import DAY, WEEK
from predictor.model import ModelConfig, NotEnoughHistory, QuantileForecaster, quantile_key
from predictor.series import FloatArray, Series, format_duration

WAPE_GOAL_RATIO = 0.8
COVERAGE_TOLERANCE = 0.03


@dataclass
class HorizonResult:
    horizon_seconds: int
    steps: int
    n_eval: int
    model: dict[str, float]
    baselines: dict[str, dict[str, float] | None]
    notes: list[str] = field(default_factory=list)

    def best_baseline(self) -> tuple[str, float]:
        scored = {k: v["wape"] for k, v in self.baselines.items() if v is not None}
        name = min(scored, key=lambda k: scored[k])
        return name, scored[name]

    def to_json(self, quantile: float) -> dict[str, Any]:
        name, best = self.best_baseline()
        ratio = self.model["wape"] / best if best > 0 else float("inf")
        cov = self.model["coverage"]
        return {
            "horizon_seconds": self.horizon_seconds,
            "steps": self.steps,
            "n_eval": self.n_eval,
            "model": self.model,
            "baselines": self.baselines,
            "best_baseline": name,
            "wape_ratio_to_best_baseline": ratio,
            "goals": {
                "wape_ratio_max": WAPE_GOAL_RATIO,
                "wape_met": ratio <= WAPE_GOAL_RATIO,
                "coverage_nominal": quantile,
                "coverage_error": cov - quantile,
                "coverage_met": abs(cov - quantile) <= COVERAGE_TOLERANCE,
            },
            "notes": self.notes,
        }


@dataclass
class BacktestResult:
    series: str
    step: int
    n_points: int
    observed: int
    quantile: float
    initial_train: int
    refit_every: int
    horizons: list[HorizonResult]
    fit_seconds: list[float]
    # per horizon: origin indices and predictions (for the plot)
    traces: dict[int, tuple[np.ndarray, FloatArray, FloatArray, FloatArray]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "series": self.series,
            "step_seconds": self.step,
            "n_points": self.n_points,
            "observed_points": self.observed,
            "quantile": self.quantile,
            "method": {
                "evaluation": "rolling origin, no look-ahead",
                "initial_train_steps": self.initial_train,
                "refit_every_steps": self.refit_every,
                "refits": len(self.fit_seconds),
                "mase_scale": "in-sample mean |y[t] - y[t-1]| over the initial history",
                "seasonal_naive_gap_fallback": "persistence",
            },
            "fit_seconds_mean": float(np.mean(self.fit_seconds)) if self.fit_seconds else None,
            "horizons": {format_duration(h.horizon_seconds): h.to_json(self.quantile) for h in self.horizons},
        }

    def table(self) -> str:
        q = quantile_key(self.quantile)
        names = ["persistence", "seasonal_day", "seasonal_week", "ewma"]
        head = (
            f"{'horizon':>7} {'n':>6} {'model':>7} "
            + " ".join(f"{n[:13]:>13}" for n in names)
            + f" {'ratio':>6} {'MASE':>6} {'cov@' + q:>8}"
        )
        lines = [f"series {self.series}: step {self.step}s, {self.n_points} points, WAPE by method", head]
        for h in self.horizons:
            _, best = h.best_baseline()
            cells = []
            for n in names:
                b = h.baselines.get(n)
                cells.append(f"{'n/a':>13}" if b is None else f"{b['wape']:>13.4f}")
            ratio = h.model["wape"] / best if best > 0 else float("inf")
            lines.append(
                f"{format_duration(h.horizon_seconds):>7} {h.n_eval:>6} {h.model['wape']:>7.4f} "
                + " ".join(cells)
                + f" {ratio:>6.3f} {h.model['mase']:>6.3f} {h.model['coverage']:>8.3f}"
            )
        return "\n".join(lines)


def _wape(actual: FloatArray, f: FloatArray) -> float:
    den = float(np.sum(np.abs(actual)))
    return float(np.sum(np.abs(actual - f))) / den if den > 0 else float("nan")


def backtest(
    series: Series,
    horizons: list[int],
    quantile: float = 0.9,
    *,
    initial_train: int | None = None,
    refit_every: int | None = None,
    config: ModelConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> BacktestResult:
    """Run the rolling-origin backtest; raises :class:`NotEnoughHistory` when the series is too short.

    ``progress(done, total)`` is called after each of the ``total`` model fits."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"--quantile {quantile} must be strictly between 0 and 1")
    step = series.step
    bad = [h for h in horizons if h % step]
    if bad:
        raise ValueError(
            f"horizon(s) {', '.join(format_duration(h) for h in bad)} are not multiples of the series step ({step}s)"
        )
    n = len(series)
    cfg = config or ModelConfig()
    cfg = ModelConfig(**{**cfg.__dict__, "horizons": tuple(horizons), "quantiles": (quantile,)})
    hmax = max(h // step for h in horizons)
    day_steps = cfg.day // step if cfg.day % step == 0 else 0
    if initial_train is None:
        initial_train = max(n // 2, cfg.min_train_rows + 2 * hmax)
    if refit_every is None:
        refit_every = day_steps if 0 < day_steps < n else max(1, n // 10)
    _check_history(series, cfg, initial_train, hmax)
    y = series.values
    init = y[:initial_train]
    d = np.abs(np.diff(init))
    mase_scale = float(np.nanmean(d)) if np.any(~np.isnan(d)) else float("nan")

    preds, origins_all, fit_seconds = _rolling_fits(series, cfg, initial_train, refit_every, progress)
    results: list[HorizonResult] = []
    traces: dict[int, tuple[np.ndarray, FloatArray, FloatArray, FloatArray]] = {}
    for h in horizons:
        result, trace = _score_horizon(
            y, h, step, np.concatenate(preds[h]), origins_all, cfg, quantile, initial_train, mase_scale
        )
        results.append(result)
        traces[h] = trace
    return BacktestResult(
        series=series.name,
        step=step,
        n_points=n,
        observed=series.observed(),
        quantile=quantile,
        initial_train=initial_train,
        refit_every=refit_every,
        horizons=results,
        fit_seconds=fit_seconds,
        traces=traces,
    )


def _check_history(series: Series, cfg: ModelConfig, initial_train: int, hmax: int) -> None:
    """Raise :class:`NotEnoughHistory` unless the series covers the initial window and the longest horizon."""
    n, step, y = len(series), series.step, series.values
    if n - initial_train <= hmax:
        raise NotEnoughHistory(
            f"history too short for horizon {format_duration(hmax * step)}: {n} points of {step}s, "
            f"{initial_train} needed for the initial training window plus more than {hmax} to evaluate; "
            f"need at least {initial_train + hmax + 1} points"
        )
    if np.count_nonzero(~np.isnan(y[:initial_train])) < cfg.min_train_rows:
        raise NotEnoughHistory(
            f"only {np.count_nonzero(~np.isnan(y[:initial_train]))} observed points in the initial "
            f"training window of {initial_train} steps; need at least {cfg.min_train_rows}"
        )


def _rolling_fits(
    series: Series,
    cfg: ModelConfig,
    initial_train: int,
    refit_every: int,
    progress: Callable[[int, int], None] | None,
) -> tuple[dict[int, list[FloatArray]], np.ndarray, list[float]]:
    """Refit every ``refit_every`` origins and predict the block after each fit: the predictions per
    horizon (one array per block), every origin predicted, and each fit's seconds."""
    n = len(series)
    preds: dict[int, list[FloatArray]] = {h: [] for h in cfg.horizons}
    origin_blocks: list[np.ndarray] = []
    fit_seconds: list[float] = []
    refits = range(initial_train, n - 1, refit_every)
    for done, r in enumerate(refits, start=1):
        block = np.arange(r, min(r + refit_every, n - 1), dtype=np.int64)
        t0 = time.perf_counter()
        model = QuantileForecaster(cfg).fit(series, upto=r)
        model.fit_seconds = time.perf_counter() - t0
        fit_seconds.append(model.fit_seconds)
        out = model.predict(series, block)
        for h in cfg.horizons:
            preds[h].append(out[h])
        origin_blocks.append(block)
        if progress is not None:
            progress(done, len(refits))
    return preds, np.concatenate(origin_blocks), fit_seconds


def _score_horizon(
    y: FloatArray,
    h: int,
    step: int,
    p: FloatArray,
    origins_all: np.ndarray,
    cfg: ModelConfig,
    quantile: float,
    initial_train: int,
    mase_scale: float,
) -> tuple[HorizonResult, tuple[np.ndarray, FloatArray, FloatArray, FloatArray]]:
    """The model's and the baselines' scores at horizon ``h`` (of ``step`` seconds each), and the trace behind them."""
    n, k = len(y), h // step
    qcol = cfg.all_quantiles.index(quantile)
    mcol = cfg.all_quantiles.index(0.5)
    keep = origins_all + k < n
    origins, p = origins_all[keep], p[keep]
    actual = y[origins + k]
    ok = ~np.isnan(actual) & ~np.isnan(y[origins]) & ~np.isnan(p[:, mcol])
    origins, p, actual = origins[ok], p[ok], actual[ok]
    base, notes = _baseline_scores(y, origins, actual, k, step, cfg, initial_train, mase_scale)
    med, up = p[:, mcol], p[:, qcol]
    model_entry = {
        "wape": _wape(actual, med),
        "mase": float(np.mean(np.abs(actual - med))) / mase_scale,
        "coverage": float(np.mean(actual <= up)),
        "pinball": float(np.mean(np.maximum(quantile * (actual - up), (quantile - 1) * (actual - up)))),
    }
    return HorizonResult(h, k, len(origins), model_entry, base, notes), (origins, actual, med, up)


def _baseline_scores(
    y: FloatArray,
    origins: np.ndarray,
    actual: FloatArray,
    k: int,
    step: int,
    cfg: ModelConfig,
    initial_train: int,
    mase_scale: float,
) -> tuple[dict[str, dict[str, float] | None], list[str]]:
    """Each baseline's WAPE and MASE at ``k`` steps ahead (None where it cannot forecast), and why not."""
    notes: list[str] = []
    base: dict[str, dict[str, float] | None] = {}
    forecasts: dict[str, FloatArray | None] = {"persistence": baselines.persistence(y, origins)}
    for label, period in (("seasonal_day", cfg.day), ("seasonal_week", cfg.week)):
        if period % step or period // step < k:
            forecasts[label] = None
            notes.append(f"{label}: period shorter than the horizon or not whole steps")
        elif origins[0] + k - period // step < 0:
            forecasts[label] = None
            notes.append(f"{label}: needs {format_duration(period)} of history before the first origin")
        else:
            forecasts[label] = baselines.seasonal_naive(y, origins, k, period // step)
    alpha = baselines.tune_ewma_alpha(y, k, initial_train - 1)
    forecasts["ewma"] = baselines.ewma(y, origins, alpha)
    for name, f in forecasts.items():
        if f is None:
            base[name] = None
            continue
        entry = {
            "wape": _wape(actual, f),
            "mase": float(np.mean(np.abs(actual - f))) / mase_scale,
        }
        if name == "ewma":
            entry["alpha"] = alpha
        base[name] = entry
    return base, notes


def write_json(result: BacktestResult, path: Path) -> None:
    path.write_text(json.dumps(result.to_json(), indent=2, sort_keys=False) + "\n")


def plot(result: BacktestResult, series: Series, path: Path) -> None:
    """Actual vs. median and the upper quantile, per horizon, over the evaluated span."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(result.horizons), 1, figsize=(12, 3 * len(result.horizons)), squeeze=False)
    for ax, h in zip(axes[:, 0], result.horizons, strict=True):
        origins, actual, med, up = result.traces[h.horizon_seconds]
        target = origins + h.steps
        lo = int(target.min()) if len(target) else 0
        t = np.arange(lo, len(series)) * series.step / 3600.0
        for values, style in (
            (actual, {"lw": 0.8, "color": "black", "label": "actual"}),
            (med, {"lw": 0.8, "color": "tab:blue", "label": "model median"}),
            (up, {"lw": 0.8, "color": "tab:orange", "label": f"model q{quantile_key(result.quantile)}"}),
        ):
            grid = np.full(len(series), np.nan)  # NaN where nothing was scored: gaps are not bridged
            grid[target] = values
            ax.plot(t, grid[lo:], **style)
        ax.set_title(
            f"{result.series}: {format_duration(h.horizon_seconds)} ahead, WAPE {h.model['wape']:.3f}, "
            f"coverage {h.model['coverage']:.3f}"
        )
        ax.set_xlabel("hours since series start (at the target time)")
        ax.set_ylabel("demand (the series' unit)")
        ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def elapsed(t0: float) -> float:
    return time.perf_counter() - t0


__all__ = ["DAY", "WEEK", "BacktestResult", "HorizonResult", "backtest", "plot", "write_json"]
