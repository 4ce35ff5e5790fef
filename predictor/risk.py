"""How much serving may need over a window, at a risk the operator chooses: pure arrays in, arrays out.

The quantity that decides lending is the **maximum** demand over ``[i, i + h]`` (a lent GPU must
stay lent for the worker's minimum useful run), so that is what is forecast, directly. The
bound at origin ``i`` is

    R[i] = exp(z[i] + q[i] * (sd[i] + eps)) - offset,   z = log(y + offset)

where ``sd`` is the recent volatility (std of one-step changes of ``z`` over the last ``w``
steps): calm hours get a narrow band, bursty hours a wide one. ``q`` is the conformal
``1 - alpha`` quantile of the scores ``(log(max + offset) - z) / (sd + eps)`` of the windows
that have ended, where ``alpha`` starts at the target risk and is tracked online (adaptive
conformal inference: after each resolved window ``alpha += gamma * (risk - missed)``), so the
realized risk follows the target after a regime change. A window's outcome is used only once
it has ended (``j + h <= i``): nothing reads past the origin. ``offset``, ``w`` and ``eps``
are chosen on the training history alone, and so are the optional width factors per hour of
the day (kept only where they validate on the newest 30 % of that history).
A series that had not started yet (leading zeros: a client not yet active) is fitted and
tracked from its first non-zero value: windows over the idle stretch say nothing about it.

A second width candidate is learnt: a quantile gradient-boosting model (``GBM_LEVEL``) of the
window-max residual ``log(max + offset) - z`` on trailing features of ``z`` (level, recent
max/min relative to now, recent volatility, hour of the day), so the band is wide where the
past says a jump is likely and narrow elsewhere. Fitted on the older 70 % of the training
history it competes with the others on the newest 30 %, needing a margin of ``GBM_MARGIN``; if
chosen it is refitted on the whole training history.

A third candidate has a **constant width** (``vol_window`` 0): ``R = exp(z + q) - offset`` with
``offset`` from ~0 (persistence x (1 + k) exactly) to 100x the mean (persistence + k), anchored on
``z`` now or on its max over a trailing window (``anchor``: 1 h, 6 h, 1 d; an outage that
recovers then costs no headroom all day, and a day-long anchor is near a static reservation).
Its offset and anchor are chosen on the training windows (least reserve at the target coverage).

The three compete on the newest 30 % of the training history: the one with the least mean
reserve at coverage, summed over the target risk and 5x it (``_validated``), is deployed.

Optionally a fourth, a width model shared by several series (:func:`fit_shared_width`, learnt
on their training histories only) competes in the same validation; it is measured by
``benchmarks.predictor_pool_sweep`` and not used by the service or ``evaluate``.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view
from sklearn.ensemble import HistGradientBoostingRegressor
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from predictor.features import DAY, rolling_mean_std
from predictor.series import FloatArray

VOL_WINDOW_SECONDS = (2 * 3600, 6 * 3600, 24 * 3600)
EPS_CHOICES = (0.02, 0.05, 0.1, 0.2, 0.4)
OFFSET_CHOICES = (0.1, 0.5, 2.0, 10.0)  # x the training mean: small = multiplicative band, large = additive
ACI_GAMMA = 0.002  # online step of the miss level (benchmarks.predictor_aci_sweep: larger tracks closer, lends less)
SCORE_POOL = 4032  # the newest resolved windows whose scores the quantile is taken over
BEYOND_MAX_SLOPE = 10.0
TOD_BUCKET_SECONDS = 3600
TOD_LEVEL = 0.9  # the width factor compares this quantile of an hour's scores with the overall one
TOD_SHRINK = 100  # an hour's factor is shrunk toward 1 by n / (n + this) (n: its training windows)
TOD_FLOOR = 0.3  # above the largest score: q grows by this x (max - median) per unit of level
GBM_LEVEL = 0.9  # the width model's quantile of the window-max residual (a scale; q sets the risk)
GBM_OFFSET = 10.0  # x the training mean: the width model works on a near-additive scale
GBM_FLOOR = 0.02  # added to the width model's output (log units): never a zero-width band
GBM_WINDOWS_SECONDS = (1800, 3600, 3 * 3600, 6 * 3600)  # trailing windows of its features
GBM_MAX_ROWS = 4000  # training origins thinned to at most this many (neighbours are near duplicates)
GBM_MIN_ROWS = 200  # fewer resolved training windows: no width model
SHARED_MARGIN = 0.05  # the shared width model's margin (as GBM_MARGIN)
SHARED_MAX_ROWS = 16000  # the shared width model's rows, over all its series
# the constant-width family (width 1, no volatility term): x the training mean, from ~0 (the bound
# is persistence x (1 + k) exactly) to large (persistence + k); anchored on now or on the max of
# the trailing window (a dip that recovers then costs no headroom; a day long: near static)
CONST_OFFSETS = (1e-6, 0.1, 0.5, 2.0, 10.0, 100.0)
CONST_ANCHOR_SECONDS = (0, 3600, 6 * 3600, 24 * 3600)
VALIDATION_SHARE = 0.3  # the newest share of the training history the width families compete on
GBM_MARGIN = 0.05  # the learnt width competes with its validated reserve x (1 + this)
VALIDATION_LEVELS = (1.0, 5.0)  # x the target risk (capped at 25 %)


class NotEnoughWindows(ValueError):
    """Too few resolved windows to calibrate or to measure a risk; the message says how many."""


def min_windows(risk: float) -> int:
    """Resolved windows needed to estimate (or to measure) a ``1 - risk`` quantile: ``ceil(1/risk)``.

    With fewer, even the largest score seen sits below the quantile asked for, so the bound
    would be a guess, and a realized risk could not be told apart from zero.
    """
    return math.ceil(1.0 / risk - 1e-9)


def window_max(y: FloatArray, h: int) -> FloatArray:
    """``max(y[i : i + h + 1])``; NaN where the window runs past the end or holds a gap."""
    n = len(y)
    out = np.full(n, np.nan)
    if n > h:
        out[: n - h] = sliding_window_view(y, h + 1).max(axis=1)  # NaN propagates: a gap is unknown
    return out


def volatility(z: FloatArray, w: int) -> FloatArray:
    """Std of the one-step changes of ``z`` over the last ``w`` steps (reads ``z[: i + 1]``)."""
    dz = np.concatenate([[np.nan], np.diff(z)])
    _, sd = rolling_mean_std(dz, w)
    return sd


def trailing_max(z: FloatArray, w: int) -> FloatArray:
    """``max(z[i - w + 1 : i + 1])`` ignoring gaps (reads ``z[: i + 1]``); NaN where ``z[i]`` is a gap.

    Doubling spans: ``log2(w)`` passes, so a day-long window costs little per request."""
    x = np.where(np.isnan(z), -np.inf, z)
    span = 1
    while span < w:
        d = min(span, w - span)  # [i - span + 1, i] and [i - d - span + 1, i - d]: [i - span - d + 1, i]
        sh = np.full(len(x), -np.inf)
        sh[d:] = x[: len(x) - d] if d < len(x) else sh[d:]
        x = np.maximum(x, sh)
        span += d
    x[np.isnan(z) | np.isneginf(x)] = np.nan
    return x


@dataclass(frozen=True)
class RiskParams:
    """A fitted risk model for one horizon (in steps) and one target risk."""

    risk: float
    horizon: int
    offset: float
    vol_window: int  # 0: constant width ``eps`` (no volatility term)
    eps: float
    q0: float  # the training quantile of the scores (used until enough windows have ended)
    step: int = 60  # seconds per index (for the time of day)
    # width factor per hour of the day (UTC), learnt on the training windows; empty: none
    tod: tuple[float, ...] = ()
    # the learnt width (quantile GBM of the window-max residual); None: volatility width
    width_model: HistGradientBoostingRegressor | None = field(default=None, compare=False, repr=False)
    anchor: int = 0  # >1: the bound is anchored on the max of ``z`` over the last ``anchor`` steps
    # a width model shared by several series (:class:`SharedWidth`) sees the level relative to
    # this series' training mean: its level feature is ``z - level_ref``
    shared: bool = False
    level_ref: float = 0.0

    def width_name(self) -> str:
        if self.width_model is not None:
            return f"gbm-quantile-{GBM_LEVEL}" + ("-shared" if self.shared else "")
        return "volatility" if self.vol_window else "constant"

    def to_json(self) -> dict[str, float | int | list[float] | str]:
        return {
            "risk": self.risk,
            "horizon_steps": self.horizon,
            "offset": self.offset,
            "vol_window_steps": self.vol_window,
            "eps": self.eps,
            "q0": self.q0,
            "time_of_day_factors": [round(f, 3) for f in self.tod],
            "width": self.width_name(),
            "anchor_steps": self.anchor,
            "shared_width": self.shared,
        }


def conformal_upper(scores: FloatArray, risk: float) -> float:
    """Finite-sample conformal ``1 - risk`` quantile (the ``ceil((n+1)(1-risk))``-th smallest)."""
    s = np.sort(scores)
    k = math.ceil((len(s) + 1) * (1.0 - risk))
    return float(s[min(k, len(s)) - 1])


def _scores(z: FloatArray, zmax: FloatArray, sd: FloatArray, eps: float) -> FloatArray:
    return (zmax - z) / (sd + eps)


def fit_risk(
    y: FloatArray,
    h: int,
    risk: float,
    step: int,
    upto: int,
    t0: int = 0,
    shared: SharedWidth | None = None,
    widths: WidthModels | None = None,
) -> RiskParams:
    """Fit on ``y[: upto + 1]`` only (``y[0]`` at ``t0``): windows that ended by ``upto`` are the
    training outcomes. ``shared``: a width model learnt over several series (this one's training
    history among them) that competes with this series' own widths. ``widths``: the width models
    already fitted for other risks on the same history (None: fit them for this call alone)."""
    if not 0.0 < risk < 0.5:
        raise ValueError(f"risk {risk} must be in (0, 0.5): it is the share of windows allowed to need more")
    hist = y[: upto + 1]
    if np.nanmin(hist) < 0:
        raise ValueError("values must be >= 0 (serving demand); found negative values")
    idle = _idle_start(hist)  # the windows before the series started say nothing about it
    hist, t0 = hist[idle:], t0 + idle * step
    mean = max(float(np.nanmean(hist)), 1e-6)
    best: tuple[float, RiskParams] | None = None
    for rel in OFFSET_CHOICES:
        best = _best_of(hist, h, risk, step, len(hist) - 1, rel * mean, best)
    if best is None:
        usable = int(np.count_nonzero(~np.isnan(window_max(hist, h)) & ~np.isnan(hist)))
        raise NotEnoughWindows(
            f"{usable} resolved windows of {h} steps in the training history"
            + (f" after its first {idle} steps of zero demand (not started yet)" if idle else "")
            + f"; risk {risk} needs at least "
            f"{min_windows(risk)} (ceil(1/risk)) with a volatility estimate, or the {1 - risk:.2f} quantile "
            "is beyond every score seen"
        )
    plain = _with_time_of_day(replace(best[1], step=step), hist, t0)
    if shared is not None and (shared.horizon, shared.step) != (h, step):
        raise ValueError(
            f"the shared width model is for {shared.horizon} steps of {shared.step}s, not {h} steps of {step}s"
        )
    const = _best_constant(plain, hist, t0, mean)
    return _with_width_model(plain, hist, t0, mean, const, shared, widths or WidthModels())


def _idle_start(hist: FloatArray) -> int:
    """Steps before the first non-zero value (a series that had not started yet: its zeros say
    nothing about the demand once it has)."""
    active = np.flatnonzero(np.nan_to_num(hist) > 0)
    return int(active[0]) if len(active) else 0


def _best_constant(plain: RiskParams, hist: FloatArray, t0: int, mean: float) -> RiskParams | None:
    """The constant-width candidate (offset x anchor) that reserves least at the target coverage
    on the training windows; None where none has enough of them."""
    best: tuple[float, RiskParams] | None = None
    anchors = sorted({max(0, round(a / plain.step)) for a in CONST_ANCHOR_SECONDS if a < len(hist) * plain.step / 3})
    for rel in CONST_OFFSETS:
        for a in anchors:
            p = replace(plain, offset=rel * mean, vol_window=0, eps=1.0, tod=(), width_model=None, anchor=a)
            reserve = _reserve_at_coverage(p, hist, t0, 0)
            if math.isfinite(reserve) and (best is None or reserve < best[0]):
                best = (reserve, p)
    return None if best is None else _calibrated(best[1], hist, t0)


def _with_time_of_day(p: RiskParams, hist: FloatArray, t0: int) -> RiskParams:
    """Width factors per hour of the day from the training windows (at least two days of them),
    kept only where factors learnt on the older 70 % reserve less, at the same coverage, on the
    newest 30 % than the plain width does."""
    if len(hist) * p.step < 2 * DAY or DAY % p.step:
        return p
    cut = int(len(hist) * (1.0 - VALIDATION_SHARE))
    older = _time_of_day(p, hist[:cut], t0)
    if not older.tod or _reserve_at_coverage(older, hist, t0, cut) >= _reserve_at_coverage(p, hist, t0, cut):
        return p
    return _time_of_day(p, hist, t0)


def width_features(z: FloatArray, step: int, t0: int, level_ref: float = 0.0) -> FloatArray:
    """Trailing features of ``z`` at every origin (row ``i`` reads ``z[: i + 1]`` only): the level
    (``z - level_ref``), the recent max and min relative to it, the recent volatility, the hour of
    the day. The same columns whatever the length (a window longer than the history is a column
    of NaN): a model fitted on a short history predicts on a longer one."""
    n = len(z)
    dz = np.concatenate([[np.nan], np.diff(z)])
    cols = [z - level_ref]
    for w in sorted({max(2, round(ws / step)) for ws in GBM_WINDOWS_SECONDS}):
        if w >= n:
            cols += [np.full(n, np.nan)] * 3
            continue
        win = sliding_window_view(z, w)
        for red in (win.max(axis=1), win.min(axis=1)):
            col = np.full(n, np.nan)
            col[w - 1 :] = red
            cols.append(col - z)
        cols.append(rolling_mean_std(dz, w)[1])
    cols.append(((t0 + step * np.arange(n, dtype=np.int64)) % DAY) / 3600.0)
    return np.column_stack(cols)


def _fit_width_model(z: FloatArray, zmax: FloatArray, x: FloatArray, upto: int) -> HistGradientBoostingRegressor | None:
    """Quantile GBM of ``zmax - z`` on the windows that ended by ``upto`` (None: too few)."""
    s = zmax[:upto] - z[:upto]
    rows = np.flatnonzero(~np.isnan(s))
    if len(rows) < GBM_MIN_ROWS:
        return None
    rows = rows[:: max(1, math.ceil(len(rows) / GBM_MAX_ROWS))]
    return _fit_gbm(x[rows], s[rows])


def _fit_gbm(x: FloatArray, s: FloatArray) -> HistGradientBoostingRegressor:
    """The quantile GBM of the width, fitted on one core (as every fit of the predictor). A feature
    unknown on every training row (a trailing window longer than the history so far) is fitted as a
    constant, which the trees never split on: sklearn cannot bin a column of NaN only."""
    unknown = np.isnan(x).all(axis=0)
    if unknown.any():
        x = x.copy()
        x[:, unknown] = 0.0
    g = HistGradientBoostingRegressor(
        loss="quantile",
        quantile=GBM_LEVEL,
        max_iter=100,
        learning_rate=0.05,
        max_leaf_nodes=15,
        min_samples_leaf=20,
        early_stopping=False,
        random_state=0,
    )
    with threadpool_limits(limits=1):
        return g.fit(x, s)


class WidthModels:
    """The width models fitted so far, for the risks fitted on the same history and horizon (the
    width model does not depend on the risk; only the choice to use it does). The caller that fits
    several risks makes one and passes it to each :func:`fit_risk`; it keeps the newest 16."""

    LIMIT = 16

    def __init__(self) -> None:
        self._models: dict[tuple[object, ...], HistGradientBoostingRegressor | None] = {}

    def get(
        self, z: FloatArray, zmax: FloatArray, x: FloatArray, upto: int, key: tuple[object, ...]
    ) -> HistGradientBoostingRegressor | None:
        """:func:`_fit_width_model` of these inputs, fitted once."""
        full = (hashlib.blake2b(z[:upto].tobytes() + zmax[:upto].tobytes(), digest_size=16).digest(), upto, *key)
        if full not in self._models:
            if len(self._models) >= self.LIMIT:
                self._models.pop(next(iter(self._models)))
            self._models[full] = _fit_width_model(z, zmax, x, upto)
        return self._models[full]


@dataclass(frozen=True)
class SharedWidth:
    """One learnt width model for several series of the same step and horizon (the pools of one
    cluster, the clients of one trace): ``older`` fitted on the older 70 % of each series'
    training history (it competes on the newest 30 %, as a series' own width model does),
    ``full`` on the whole of each. Features are per series: the level relative to the series'
    training mean (:func:`_level_ref`), the rest relative to the level already."""

    horizon: int
    step: int
    older: HistGradientBoostingRegressor | None = field(compare=False, repr=False)
    full: HistGradientBoostingRegressor | None = field(compare=False, repr=False)
    series: int = 0  # how many series it was learnt on


def _level_ref(mean: float) -> float:
    """The log level of a series at its training mean, on the width model's scale."""
    return math.log((1.0 + GBM_OFFSET) * mean)


def _residual_rows(hist: FloatArray, h: int, step: int, t0: int, upto: int) -> tuple[FloatArray, FloatArray]:
    """Features and window-max residuals of the windows of ``hist`` that ended by ``upto``
    (thinned to :data:`GBM_MAX_ROWS`), on the shared scale."""
    mean = max(float(np.nanmean(hist)), 1e-6)
    z = np.log(np.clip(hist, 0.0, None) + GBM_OFFSET * mean)
    s = (np.log(window_max(hist, h) + GBM_OFFSET * mean) - z)[:upto]
    rows = np.flatnonzero(~np.isnan(s))
    rows = rows[:: max(1, math.ceil(len(rows) / GBM_MAX_ROWS))]
    return width_features(z, step, t0, _level_ref(mean))[rows], s[rows]


def fit_shared_width(histories: list[tuple[FloatArray, int]], h: int, step: int) -> SharedWidth:
    """The width model of :class:`SharedWidth` from each series' training history ``(y, t0)``
    (reads nothing else; a series too short for a window adds no rows)."""
    parts: dict[str, list[tuple[FloatArray, FloatArray]]] = {"older": [], "full": []}
    for y, t0 in histories:
        if len(y) <= h or np.all(np.isnan(y)):
            continue
        cut = int(len(y) * (1.0 - VALIDATION_SHARE))
        parts["older"].append(_residual_rows(y, h, step, t0, cut - h))
        parts["full"].append(_residual_rows(y, h, step, t0, len(y)))
    models = {k: _fit_rows(v) for k, v in parts.items()}
    return SharedWidth(h, step, models["older"], models["full"], len(parts["full"]))


def _fit_rows(parts: list[tuple[FloatArray, FloatArray]]) -> HistGradientBoostingRegressor | None:
    if not parts or sum(len(s) for _, s in parts) < GBM_MIN_ROWS:
        return None
    x = np.concatenate([p[0] for p in parts])
    s = np.concatenate([p[1] for p in parts])
    keep = np.arange(0, len(s), max(1, math.ceil(len(s) / SHARED_MAX_ROWS)))
    return _fit_gbm(x[keep], s[keep])


def _validated(p: RiskParams, hist: FloatArray, t0: int, cut: int) -> float:
    """Mean reserve on the newest 30 % at the target and at a less extreme level (the newest
    30 % hold few windows beyond the ``1 - risk`` quantile: one level alone would choose on a
    handful of them)."""
    return sum(_reserve_at_coverage(p, hist, t0, cut, min(0.25, m * p.risk)) for m in VALIDATION_LEVELS)


def _with_width_model(
    plain: RiskParams,
    hist: FloatArray,
    t0: int,
    mean: float,
    const: RiskParams | None,
    shared: SharedWidth | None,
    widths: WidthModels,
) -> RiskParams:
    """The learnt or the constant width instead of the volatility one, where it validates (see
    the module doc)."""
    cut = int(len(hist) * (1.0 - VALIDATION_SHARE))
    offset = GBM_OFFSET * mean
    z = np.log(np.clip(hist, 0.0, None) + offset)
    zmax = np.log(window_max(hist, plain.horizon) + offset)
    x = width_features(z, plain.step, t0)
    key = (plain.horizon, plain.step, t0, len(hist))
    older = widths.get(z, zmax, x, cut - plain.horizon, key)
    cands = [plain] + ([] if const is None else [const])
    if older is not None:
        cands.append(replace(plain, offset=offset, tod=(), width_model=older))
    if shared is not None and shared.older is not None:
        ref = _level_ref(mean)
        cands.append(replace(plain, offset=offset, tod=(), width_model=shared.older, shared=True, level_ref=ref))
    # the learnt width must win by GBM_MARGIN: it is refitted on the whole history after this
    # choice, and that refit moves its shape more than the others' (see the README's figures)
    scored = [(_validated(c, hist, t0, cut) * (1.0 + _margin(c)), i) for i, c in enumerate(cands)]
    _, win = min(scored)
    if cands[win].width_model is None:
        return cands[win]
    if cands[win].shared:
        assert shared is not None
        full = replace(cands[win], width_model=shared.full)
    else:
        full = replace(cands[win], width_model=widths.get(z, zmax, x, len(hist), key))
    return _calibrated(full, hist, t0)


def _margin(p: RiskParams) -> float:
    """What a candidate's validated reserve is scaled by in the choice: the learnt widths' margin."""
    if p.width_model is None:
        return 0.0
    return SHARED_MARGIN if p.shared else GBM_MARGIN


def _time_of_day(p: RiskParams, hist: FloatArray, t0: int) -> RiskParams:
    tod = tod_factors(_window_scores(p, hist, t0)[2], tod_bucket(t0, p.step, len(hist)))
    return _calibrated(replace(p, tod=tod), hist, t0) if tod else p


def _window_scores(p: RiskParams, hist: FloatArray, t0: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``z`` and the width ``p``'s bound is anchored on, and the score of every window of ``hist``
    (NaN where it has not ended or holds a gap)."""
    z, width = _anchor(p, hist, t0)
    return z, width, _scores(z, np.log(window_max(hist, p.horizon) + p.offset), width, 0.0)


def _calibrated(p: RiskParams, hist: FloatArray, t0: int) -> RiskParams:
    """``p`` with ``q0`` the conformal ``1 - risk`` quantile of its scores on the windows of ``hist``."""
    s = _window_scores(p, hist, t0)[2]
    return replace(p, q0=conformal_upper(s[~np.isnan(s)], p.risk))


def _reserve_at_coverage(p: RiskParams, hist: FloatArray, t0: int, start: int, level: float | None = None) -> float:
    """Mean bound over the windows from ``start`` with ``q`` set to their ``1 - level`` quantile
    (``level`` defaults to the target risk)."""
    level = p.risk if level is None else level
    z, width, s = _window_scores(p, hist, t0)
    s = s[start:]
    ok = ~np.isnan(s)
    if np.count_nonzero(ok) < min_windows(level):
        return math.inf
    q = conformal_upper(s[ok], level)
    with np.errstate(over="ignore"):
        return float(np.mean(np.exp(z[start:][ok] + q * width[start:][ok]))) - p.offset


def _best_of(
    hist: FloatArray, h: int, risk: float, step: int, upto: int, offset: float, best: tuple[float, RiskParams] | None
) -> tuple[float, RiskParams] | None:
    z = np.log(hist + offset)
    zmax = np.log(window_max(hist, h) + offset)
    # a short history (an hour-long trace) caps the window at a third of it
    for w in sorted({max(3, min(round(ws / step), (upto + 1) // 3)) for ws in VOL_WINDOW_SECONDS}):
        sd = volatility(z, w)
        for eps in EPS_CHOICES:
            s = _scores(z, zmax, sd, eps)
            ok = ~np.isnan(s)
            if np.count_nonzero(ok) < min_windows(risk):
                continue
            q = conformal_upper(s[ok], risk)
            # the same coverage on the training windows for every candidate: keep the one that
            # reserves least (lends most) on them
            with np.errstate(over="ignore"):  # an infinite reserve is simply never the best
                reserve = float(np.mean(np.exp(z[ok] + q * (sd[ok] + eps)))) - offset  # in demand units
            p = RiskParams(risk, h, offset, w, eps, q)
            if best is None or reserve < best[0]:
                best = (reserve, p)
    return best


def level_quantile(srt: list[float], level: float) -> float:
    """The ``level`` quantile of the sorted scores ``srt`` (numpy's ``method="higher"``); above 1,
    linear beyond the largest score (never infinite)."""
    n = len(srt)
    if level <= 0.0:
        return srt[0]
    if level >= 1.0:
        median = 0.5 * (srt[(n - 1) // 2] + srt[n // 2])
        return srt[-1] + BEYOND_MAX_SLOPE * (level - 1.0) * (srt[-1] - median)
    return srt[min(n - 1, math.ceil(level * (n - 1) - 1e-12))]


def track_q(p: RiskParams, y: FloatArray, start: int, stop: int, t0: int = 0) -> FloatArray:
    """``q`` in effect at each origin in ``[start, stop)`` (NaN outside): adaptive conformal inference.

    ``q[i]`` is the ``1 - alpha_i`` quantile of the scores of the windows that have ended by
    ``i`` among the newest :data:`SCORE_POOL` origins (training windows included; none before
    the series' first non-zero value, as in :func:`fit_risk`). Before
    answering at ``i`` the tracker takes in origin ``j = i - h``, whose window ``[j, j + h]``
    has just ended: ``alpha += ACI_GAMMA * (risk - missed_j)``. Reads ``y[: i + 1]`` only.
    """
    idle = _idle_start(y[:start])
    if idle:
        q = np.full(stop, np.nan)
        q[idle:] = track_q(p, y[idle:stop], start - idle, stop - idle, t0 + idle * p.step)
        return q
    s = _window_scores(p, y[:stop], t0)[2]
    q = np.full(stop, np.nan)
    alpha = p.risk
    few = min_windows(p.risk)
    j0 = start - p.horizon
    first = s[max(0, j0 - SCORE_POOL + 1) : max(0, j0 + 1)]
    srt = sorted(first[~np.isnan(first)].tolist())  # the pool, kept sorted as windows end
    for i in range(start, stop):
        j = i - p.horizon
        if i > start:
            _slide(srt, s, j, j - SCORE_POOL)
        if j >= start and not (math.isnan(s[j]) or math.isnan(q[j])):
            alpha += ACI_GAMMA * (p.risk - (1.0 if s[j] > q[j] else 0.0))
        q[i] = level_quantile(srt, 1.0 - alpha) if len(srt) >= few else p.q0
    return q


def _slide(srt: list[float], s: FloatArray, new: int, old: int) -> None:
    """Window ``new`` has ended (insert its score), window ``old`` leaves the pool (remove it)."""
    if new >= 0 and not math.isnan(s[new]):
        bisect.insort(srt, float(s[new]))
    if old >= 0 and not math.isnan(s[old]):
        del srt[bisect.bisect_left(srt, float(s[old]))]


def _anchor(p: RiskParams, y: FloatArray, t0: int) -> tuple[FloatArray, FloatArray]:
    """``z`` (the log level the bound is anchored on) and the width ``(sd + eps) * tod`` at each
    origin; ``t0`` is the time (epoch seconds) of ``y[0]``."""
    z = np.log(np.clip(y, 0.0, None) + p.offset)
    if p.width_model is not None:
        with threadpool_limits(limits=1):
            pred = p.width_model.predict(width_features(z, p.step, t0, p.level_ref))
        return z, np.clip(pred, 0.0, None) + GBM_FLOOR
    if not p.vol_window:
        return (trailing_max(z, p.anchor) if p.anchor > 1 else z), np.full(len(z), p.eps)
    width = volatility(z, p.vol_window) + p.eps
    if p.tod:
        width = width * np.asarray(p.tod)[tod_bucket(t0, p.step, len(y))]
    return z, width


def tod_bucket(t0: int, step: int, n: int) -> npt.NDArray[np.int64]:
    """Hour of the day (UTC) of each index."""
    out: npt.NDArray[np.int64] = ((t0 + step * np.arange(n, dtype=np.int64)) % DAY) // TOD_BUCKET_SECONDS
    return out


def tod_factors(scores: FloatArray, buckets: npt.NDArray[np.int64]) -> tuple[float, ...]:
    """Per hour of the day: the hour's 0.9 quantile of the scores over the overall one, shrunk
    toward 1 by ``n / (n + TOD_SHRINK)`` (an hour seen in few windows keeps the plain width)."""
    ok = ~np.isnan(scores)
    overall = float(np.quantile(scores[ok], TOD_LEVEL))
    if overall <= 0:
        return ()
    out = []
    for b in range(DAY // TOD_BUCKET_SECONDS):
        m = ok & (buckets == b)
        n = int(m.sum())
        f = float(np.quantile(scores[m], TOD_LEVEL)) / overall if n >= 5 else 1.0
        w = n / (n + TOD_SHRINK)
        out.append(max(TOD_FLOOR, w * f + (1 - w)))
    return tuple(out)


def bound(p: RiskParams, y: FloatArray, q: FloatArray, shift_q: float = 0.0, t0: int = 0) -> FloatArray:
    """The window-max bound at every origin of ``y`` given ``q`` (NaN where unknown)."""
    z, sd = _anchor(p, y, t0)
    out: FloatArray = np.clip(np.exp(z + (q + shift_q) * sd) - p.offset, 0.0, None)
    return out


def threshold_shift(p: RiskParams, y: FloatArray, q: FloatArray, limit: FloatArray, t0: int = 0) -> FloatArray:
    """Per origin, the ``shift_q`` above which ``bound`` exceeds ``limit`` (for equal-risk sweeps)."""
    z, sd = _anchor(p, y, t0)
    with np.errstate(invalid="ignore", divide="ignore"):
        need = np.log(np.clip(limit, 0.0, None) + p.offset)
        out: FloatArray = np.where(limit < 0, -np.inf, (need - z) / sd - q)
    return out


def forecast_now(p: RiskParams, y: FloatArray, warmup: int, t0: int = 0) -> float:
    """The bound at the newest point of ``y`` (``y[0]`` at ``t0``), q tracked over the last ``warmup`` steps."""
    n = len(y)
    start = max(0, n - warmup)
    q = track_q(p, y, start, n, t0)
    return float(bound(p, y, q, 0.0, t0)[-1])


def monotone_in_risk(bounds: dict[float, float]) -> dict[float, float]:
    """Per risk, the largest bound of the risks at least as large: each risk has its own fitted
    model (width family chosen per risk), and a smaller risk must never reserve less."""
    out: dict[float, float] = {}
    top = -math.inf
    for r in sorted(bounds, reverse=True):
        if math.isnan(bounds[r]):  # unknown stays unknown (the caller answers with the safe bound)
            out[r] = bounds[r]
            continue
        top = max(top, bounds[r])
        out[r] = top
    return dict(sorted(out.items()))
