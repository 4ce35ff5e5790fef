"""GPU-time lent at a chosen risk: the predictor judged by what it lets ROSE lend (rolling origin).

Input: a :class:`Series`, horizons, target risks and the pool size (``gpus_at_peak`` or
``capacity_per_gpu``); output: an :class:`EvaluateResult` (JSON, table, plot). Pure except
:func:`write_json` and :func:`plot`.

For origin ``i`` and horizon ``h`` serving needs ``need[i] = ceil(max(y[i..i+h]) / capacity)``
GPUs; a policy reserves ``ceil(R[i] / capacity)`` (at most the pool) and lends the rest. An
under-provision is a window where the reservation is below the need. Every policy is scored on
the same origins (the second part of the series; the first is training only):

* ``model``: :mod:`predictor.risk` fitted on the training part, calibrated online as windows end;
* ``persistence``: ``y[i] * (1 + k)``; ``persistence_add``: ``y[i] + k``; ``seasonal``:
  yesterday's max over the same window ``* (1 + k)``; ``static``: a constant reservation ``k``
  — each ``k`` tuned on the training part to the target risk;
* ``oracle``: the need itself (risk 0; the most that can be lent).

The fair comparison, **lent at equal realized risk**: every policy's knob swept on the
evaluated origins until its realized risk is the target (exact: each origin has a threshold
knob value above which it is covered), then the GPU-time lent at that point.

What a **perfectly calibrated** policy would realize on the same windows
(:func:`perfect_policy`): overlapping windows make misses come in runs (one burst
under-provisions every window that contains it), so the realized risk of even a perfect policy
is the share of ``n`` windows covered by a random number of miss *runs*, not a binomial share.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from predictor import risk as rk
from predictor.features import DAY
from predictor.series import FloatArray, Series, format_duration

LEND_GOAL_RATIO = 1.15
RISK_TOLERANCE = 0.30  # relative


@dataclass(frozen=True)
class Pool:
    """``capacity`` = demand one GPU serves; ``gpus`` = pool size."""

    capacity: float
    gpus: int

    @staticmethod
    def sized(peak: float, gpus_at_peak: int | None, capacity_per_gpu: float | None) -> Pool:
        if gpus_at_peak is not None and capacity_per_gpu is not None:
            raise ValueError("give either --gpus-at-peak or --capacity-per-gpu, not both")
        if capacity_per_gpu is not None:
            if capacity_per_gpu <= 0:
                raise ValueError(f"--capacity-per-gpu {capacity_per_gpu} must be > 0")
            return Pool(capacity_per_gpu, max(1, math.ceil(peak / capacity_per_gpu - 1e-9)))
        g = 64 if gpus_at_peak is None else gpus_at_peak
        if g < 1:
            raise ValueError(f"--gpus-at-peak {g} must be >= 1")
        if peak <= 0:
            raise ValueError("the series never exceeds 0: cannot size a pool from its peak")
        return Pool(peak / g, g)

    def gpus_for(self, demand: FloatArray) -> FloatArray:
        out: FloatArray = np.minimum(np.ceil(np.clip(demand, 0.0, None) / self.capacity - 1e-9), self.gpus)
        return out

    def shortfall_limit(self, need_demand: FloatArray) -> FloatArray:
        """A reservation covers the window iff it is above this demand (one GPU short of the need)."""
        out: FloatArray = self.capacity * (np.ceil(need_demand / self.capacity - 1e-9) - 1.0)
        return out


def knob_at_risk(thresholds: FloatArray, risk: float) -> float:
    """The smallest knob whose realized risk (share of ``thresholds >= knob``) is at most ``risk``."""
    t = np.sort(thresholds)[::-1]
    allowed = math.floor(risk * len(t) + 1e-9)
    if allowed >= len(t):
        return -math.inf
    kth = float(t[allowed])
    if math.isinf(kth):
        return kth
    return kth + 1e-9 * (1.0 + abs(kth))


@dataclass
class Scored:
    risk: float
    lent: float  # share of the pool's GPU-time lent
    knob: float

    def to_json(self) -> dict[str, float]:
        return {"realized_risk": self.risk, "lent_share": self.lent, "knob": self.knob}


@dataclass
class PolicyResult:
    tuned: Scored  # knob chosen on the training part (the model: its own calibration)
    equal_risk: Scored  # knob swept on the evaluated origins to the target risk

    def to_json(self) -> dict[str, Any]:
        return {"as_tuned": self.tuned.to_json(), "at_equal_risk": self.equal_risk.to_json()}


@dataclass
class CaseResult:
    horizon_seconds: int
    steps: int
    risk: float
    n_eval: int
    policies: dict[str, PolicyResult | None]
    oracle_lent: float
    model_params: dict[str, float | int | list[float] | str]
    notes: list[str] = field(default_factory=list)
    # how predictable the best baseline's misses were from the past (see miss_evidence)
    evidence: dict[str, float] = field(default_factory=dict)
    # for the plot: origins and the reservations (demand units) of model and the best baseline
    trace: dict[str, FloatArray] = field(default_factory=dict)
    # what a perfectly calibrated policy realizes on these windows (see perfect_policy)
    perfect: dict[str, Any] = field(default_factory=dict)

    def best_baseline(self) -> tuple[str, float]:
        # a baseline whose knob cannot reach the target (persistence x (1 + k) when more windows rise
        # from zero than the risk allows) is not at equal risk: it does not compete
        scored = {
            k: v.equal_risk.lent
            for k, v in self.policies.items()
            if v is not None and k != "model" and v.equal_risk.risk <= self.risk + 1e-12
        }
        name = max(scored, key=lambda k: scored[k])
        return name, scored[name]

    def ratio(self) -> float:
        _, best = self.best_baseline()
        m = self.policies["model"]
        assert m is not None
        return m.equal_risk.lent / best if best > 0 else math.inf

    def to_json(self) -> dict[str, Any]:
        name, best = self.best_baseline()
        m = self.policies["model"]
        assert m is not None
        ratio = self.ratio()
        rel = (m.tuned.risk - self.risk) / self.risk
        lo, hi = self.perfect["interval_5_95"] if self.perfect else (math.nan, math.nan)
        return {
            "horizon_seconds": self.horizon_seconds,
            "steps": self.steps,
            "risk": self.risk,
            "n_eval": self.n_eval,
            "policies": {k: None if v is None else v.to_json() for k, v in self.policies.items()},
            "oracle_lent_share": self.oracle_lent,
            "best_baseline": name,
            "lent_ratio_at_equal_risk": ratio,
            # what perfect foresight would reach against the same baseline: the goal is out of
            # reach for any policy when this is below it
            "oracle_ratio": self.oracle_lent / best if best > 0 else math.inf,
            # realized risk of a perfectly calibrated policy on n independent windows: 5-95 %
            "binomial_band": binomial_band(self.n_eval, self.risk),
            # the same with the misses in runs as long as this series' runs at the target risk
            "perfect_policy": self.perfect,
            "model_params": self.model_params,
            "goals": {
                "lent_ratio_min": LEND_GOAL_RATIO,
                "lent_met": ratio >= LEND_GOAL_RATIO,
                "risk_relative_error": rel,
                "risk_met": abs(rel) <= RISK_TOLERANCE,
                # inside the 5-95 % interval of a perfectly calibrated policy's realized risk
                "risk_consistent": bool(lo <= m.tuned.risk <= hi),
            },
            "best_baseline_miss_evidence": self.evidence,
            "notes": self.notes,
        }


@dataclass
class EvaluateResult:
    series: str
    step: int
    n_points: int
    pool: Pool
    initial_train: int
    cases: list[CaseResult]

    def to_json(self) -> dict[str, Any]:
        return {
            "series": self.series,
            "step_seconds": self.step,
            "n_points": self.n_points,
            "pool": {"gpus": self.pool.gpus, "capacity_per_gpu": self.pool.capacity},
            "method": {
                "evaluation": "rolling origin, no look-ahead; windows [now, now + h], need = max demand",
                "initial_train_steps": self.initial_train,
                "baselines_tuned_on": "the training part only",
                "equal_risk": "each policy's knob swept on the evaluated origins to the target risk",
            },
            "cases": [c.to_json() for c in self.cases],
        }

    def table(self) -> str:
        names = ["model", "persistence", "persistence_add", "seasonal", "static"]
        lines = [
            f"series {self.series}: {self.n_points} points of {self.step}s, pool {self.pool.gpus} GPUs "
            f"of {self.pool.capacity:.4g}; lent share at equal risk (realized risk as tuned)",
            f"{'h':>5} {'risk':>5} {'n':>6} " + " ".join(f"{n:>18}" for n in names) + f" {'oracle':>7} {'ratio':>6}",
        ]
        for c in self.cases:
            cells = []
            for n in names:
                p = c.policies.get(n)
                cells.append(f"{'n/a':>18}" if p is None else f"{p.equal_risk.lent:>8.3f} ({p.tuned.risk:>6.3f})")
            lines.append(
                f"{format_duration(c.horizon_seconds):>5} {c.risk:>5.2f} {c.n_eval:>6} "
                + " ".join(cells)
                + f" {c.oracle_lent:>7.3f} {c.ratio():>6.3f}"
            )
        return "\n".join(lines)


def binomial_band(n: int, risk: float) -> list[float]:
    """5 % and 95 % quantiles of the miss share of a policy whose every window misses with ``risk``."""
    if n <= 0:
        return [math.nan, math.nan]
    return _interval_5_95(_binomial_pmf(n, risk))


def _interval_5_95(pmf: FloatArray) -> list[float]:
    """5 % and 95 % quantiles of the miss share whose count ``s`` of ``n`` has probability ``pmf[s]``."""
    cdf, n = np.cumsum(pmf), len(pmf) - 1
    return [float(np.searchsorted(cdf, 0.05)) / n, float(np.searchsorted(cdf, 0.95)) / n]


def _binomial_pmf(n: int, p: float) -> FloatArray:
    k = np.arange(n + 1)
    if p >= 1.0:
        certain: FloatArray = (k == n).astype(np.float64)
        return certain
    log_choose = np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in k])
    out: FloatArray = np.exp(log_choose + k * math.log(p) + (n - k) * math.log1p(-p))
    return out


def miss_runs(origins: np.ndarray, missed: np.ndarray) -> list[int]:
    """Lengths of the runs of missed origins, in order; a run continues only to the next index
    (a gap or a covered origin ends it)."""
    runs: list[int] = []
    prev = -2
    for i in origins[missed].tolist():
        if i == prev + 1:
            runs[-1] += 1
        else:
            runs.append(1)
        prev = i
    return runs


def clustered_miss_pmf(n: int, risk: float, runs: list[int]) -> FloatArray:
    """Distribution of the number of missed windows out of ``n`` (index ``s`` = ``s`` misses) when
    miss *events* start at each origin independently with probability ``risk / mean(runs)`` and
    each covers a run of windows whose length is drawn from ``runs`` (empty: single windows):

        S = L_1 + ... + L_K,  K ~ Binomial(n, risk / mean(L)),  so that E[S] / n = risk.

    Exact, by conditioning on ``K`` (convolution powers of the run-length distribution, up to
    the ``K`` beyond which the binomial tail is below 1e-12); more than ``n`` misses is counted
    as ``n``. Runs of length 1 give the binomial distribution."""
    if n <= 0:
        raise ValueError(f"{n} windows: a realized risk needs at least one")
    lengths = np.asarray(runs or [1], dtype=np.int64)
    if lengths.min() < 1:
        raise ValueError(f"miss run lengths must be >= 1, got {lengths.min()}")
    run_pmf = np.bincount(lengths) / len(lengths)
    k_pmf = _binomial_pmf(n, min(1.0, risk / float(lengths.mean())))
    k_max = min(n, int(np.searchsorted(np.cumsum(k_pmf), 1.0 - 1e-12)) + 1)
    out = np.zeros(n + 1)
    conv, over = np.ones(1), 0.0  # the misses of k events (k = 0 first); over: their mass beyond n
    for k in range(k_max + 1):
        out[: len(conv)] += k_pmf[k] * conv
        out[n] += k_pmf[k] * over
        nxt = np.convolve(conv, run_pmf)
        over += float(nxt[n + 1 :].sum())
        conv = nxt[: n + 1]
    result: FloatArray = out / out.sum()
    return result


def perfect_policy(n: int, risk: float, runs: list[int]) -> dict[str, Any]:
    """The realized risk of a perfectly calibrated policy on ``n`` windows whose misses come in
    runs like ``runs`` (:func:`clustered_miss_pmf`): its 5-95 % interval, the probability that
    it lands within +-:data:`RISK_TOLERANCE` of the target, and the runs it assumed."""
    pmf = clustered_miss_pmf(n, risk, runs)
    share = np.arange(n + 1) / n
    within = np.abs((share - risk) / risk) <= RISK_TOLERANCE  # the same test as the goal's
    return {
        "interval_5_95": _interval_5_95(pmf),
        "p_within_tolerance": float(pmf[within].sum()),
        "mean_run": float(np.mean(runs)) if runs else 1.0,
        "miss_runs": runs,
    }


def score(pool: Pool, reserve: FloatArray, need: FloatArray, knob: float) -> Scored:
    """Realized risk and share of GPU-time lent when ``reserve`` is kept for windows needing ``need``."""
    r = pool.gpus_for(reserve)
    missed = r < pool.gpus_for(need)
    return Scored(float(np.mean(missed)), float(np.mean(pool.gpus - r)) / pool.gpus, knob)


def _family(
    base: FloatArray, limit: FloatArray, train: np.ndarray, test: np.ndarray, risk: float
) -> tuple[float, float, FloatArray]:
    """Multiplicative headroom ``base * (1 + k)``: (k tuned on train, k at target risk on test, thresholds)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        th = np.where(base > 0, limit / base - 1.0, np.where(limit < 0, -np.inf, np.inf))
    return knob_at_risk(th[train], risk), knob_at_risk(th[test], risk), th


def _times(base: FloatArray, factor: float) -> FloatArray:
    """``base * factor`` where an infinite factor leaves a zero base at zero (never NaN)."""
    with np.errstate(invalid="ignore", over="ignore"):
        out: FloatArray = np.where(base > 0, base * factor, 0.0)
    return out


def _policy(
    pool: Pool, reserve_at: Any, need: FloatArray, k_train: float, k_test: float, eq: dict[str, FloatArray], name: str
) -> PolicyResult:
    eq[name] = reserve_at(k_test)  # the reserve at equal risk, for the evidence on its misses
    return PolicyResult(score(pool, reserve_at(k_train), need, k_train), score(pool, reserve_at(k_test), need, k_test))


def _baselines(
    y: FloatArray,
    h: int,
    period: int,
    pool: Pool,
    train: np.ndarray,
    test: np.ndarray,
    risk: float,
    notes: list[str],
    eq: dict[str, FloatArray],
) -> tuple[dict[str, PolicyResult | None], dict[str, FloatArray]]:
    wm = rk.window_max(y, h)
    limit = pool.shortfall_limit(wm)
    need = wm[test]
    out: dict[str, PolicyResult | None] = {}
    lines: dict[str, FloatArray] = {}
    kt, ke, _ = _family(y, limit, train, test, risk)
    out["persistence"] = _policy(pool, lambda k: _times(y[test], 1 + k), need, kt, ke, eq, "persistence")
    lines["persistence"] = _times(y, 1 + kt)
    th = limit - y  # additive headroom (demand units): covers a window at zero demand too
    kt, ke = knob_at_risk(th[train], risk), knob_at_risk(th[test], risk)
    out["persistence_add"] = _policy(pool, lambda k: y[test] + k, need, kt, ke, eq, "persistence_add")
    lines["persistence_add"] = y + kt
    seas = np.full(len(y), np.nan)
    if period > h and period < len(y):
        seas[period:] = wm[: len(y) - period]  # max over [i - p, i - p + h]: ended by i
    s_train, s_test = train[~np.isnan(seas[train])], test[~np.isnan(seas[test])]
    if len(s_train) >= rk.min_windows(risk) and len(s_test) == len(test):
        kt, ke, _ = _family(seas, limit, s_train, test, risk)
        out["seasonal"] = _policy(pool, lambda k: _times(seas[test], 1 + k), need, kt, ke, eq, "seasonal")
        lines["seasonal"] = _times(seas, 1 + kt)
    else:
        out["seasonal"] = None
        notes.append("seasonal: needs one day of history and an observed window one day before every evaluated origin")
    kt, ke = knob_at_risk(limit[train], risk), knob_at_risk(limit[test], risk)
    out["static"] = _policy(pool, lambda k: np.full(len(test), k), need, kt, ke, eq, "static")
    lines["static"] = np.full(len(y), kt)
    return out, lines


def evaluate_case(
    series: Series,
    h: int,
    risk: float,
    pool: Pool,
    initial_train: int,
    day: int = DAY,
    shared: rk.SharedWidth | None = None,
    widths: rk.WidthModels | None = None,
) -> CaseResult:
    """One (horizon in steps, risk) pair: every policy on the origins after ``initial_train``
    (``shared``: a width model learnt on several series' training parts, see ``risk.fit_risk``;
    measured by ``benchmarks.predictor_pool_sweep``, not used by ``rose predictor evaluate``;
    ``widths``: the width models fitted for the other risks on this series, see ``risk.WidthModels``)."""
    y = series.values
    n = len(y)
    wm = rk.window_max(y, h)
    ok = ~np.isnan(wm) & ~np.isnan(y)
    idx = np.arange(n)
    train = np.flatnonzero(ok & (idx + h < initial_train))
    notes: list[str] = []
    t0 = series.start
    params = rk.fit_risk(y, h, risk, series.step, initial_train - 1, t0, shared, widths)
    q = rk.track_q(params, y, initial_train, n, t0)
    model_res = rk.bound(params, y, q, 0.0, t0)
    test = np.flatnonzero(ok & (idx >= initial_train) & ~np.isnan(model_res))
    if len(test) < rk.min_windows(risk):
        raise rk.NotEnoughWindows(
            f"{len(test)} windows of {format_duration(h * series.step)} to evaluate after the training part; "
            f"measuring a risk of {risk} needs at least {rk.min_windows(risk)} (ceil(1/risk))"
        )
    period = day // series.step if day % series.step == 0 else 0
    eq: dict[str, FloatArray] = {}
    policies, lines = _baselines(y, h, period, pool, train, test, risk, notes, eq)
    limit = pool.shortfall_limit(wm)
    th = rk.threshold_shift(params, y, q, limit, t0)
    k_eq = knob_at_risk(th[test], risk)
    need = wm[test]
    at_target = rk.bound(params, y, q, k_eq, t0)[test]
    policies["model"] = PolicyResult(score(pool, model_res[test], need, 0.0), score(pool, at_target, need, k_eq))
    oracle = float(np.mean(pool.gpus - pool.gpus_for(need))) / pool.gpus
    case = CaseResult(h * series.step, h, risk, len(test), policies, oracle, params.to_json(), notes)
    best, _ = case.best_baseline()
    case.evidence = miss_evidence(y, h, pool, test, eq[best], series.step)
    # the model swept to exactly the target risk: how misses cluster on this series at that rate
    need_gpus = pool.gpus_for(need)
    case.perfect = perfect_policy(len(test), risk, miss_runs(test, pool.gpus_for(at_target) < need_gpus))
    case.perfect["model_miss_runs"] = miss_runs(test, pool.gpus_for(model_res[test]) < need_gpus)
    case.trace = {"origins": test.astype(np.float64), "model": model_res, "baseline": lines[best], "need": wm}
    case.notes.append(f"best baseline at equal risk: {best}")
    return case


def miss_evidence(
    y: FloatArray, h: int, pool: Pool, test: np.ndarray, reserve: FloatArray, step: int
) -> dict[str, float]:
    """How much of a policy's misses the past could have announced, on the evaluated origins.

    ``rise[i] = max(y[i..i+h]) - y[i]`` (what the window adds to now). ``unannounced_share``: of
    the windows the policy under-provisions (``reserve`` at equal risk), the share whose rise is
    larger than every rise of the windows that ended in the hour before the origin (``j + h`` in
    ``[i - 1h, i]``): no recent window showed a jump that large. ``rise_autocorr``: the
    correlation of ``rise[i]`` with ``rise[i - h]``, the newest rise known at ``i``; near 0 means
    the size of the next rise is not predictable from the last one.
    """
    rise = rk.window_max(y, h) - y
    hour = max(1, DAY // 24 // step)
    known = np.full(len(y), np.nan)  # max rise over windows that ended in the hour up to i
    for i in test:
        past = rise[max(0, i - hour - h) : max(0, i - h + 1)]
        past = past[~np.isnan(past)]
        known[i] = past.max() if len(past) else np.nan
    missed = test[pool.gpus_for(reserve) < pool.gpus_for(rk.window_max(y, h)[test])]
    prev = rise[test - h]
    ok = ~np.isnan(prev) & ~np.isnan(rise[test])
    a, b = rise[test][ok], prev[ok]
    with np.errstate(invalid="ignore", divide="ignore"):  # a constant rise has no correlation: NaN
        rho = float(np.corrcoef(a, b)[0, 1]) if len(a) > 2 and a.std() > 0 and b.std() > 0 else math.nan
    with np.errstate(invalid="ignore"):
        unannounced = rise[missed] > known[missed]  # NaN (no known past) counts as announced
    return {
        "misses": float(len(missed)),
        "unannounced_share": float(np.mean(unannounced)) if len(missed) else math.nan,
        "rise_autocorr": rho,
    }


def minimum_points(h: int, risk: float) -> int:
    """Shortest series evaluable at this horizon and risk: ``ceil(1/risk)`` resolved windows to
    calibrate on, as many to measure the risk on, plus the window itself (and 3 steps of
    volatility history)."""
    return 2 * rk.min_windows(risk) + 2 * h + 3


def evaluate(
    series: Series,
    horizons: list[int],
    risks: list[float],
    *,
    gpus_at_peak: int | None = None,
    capacity_per_gpu: float | None = None,
    initial_train: int | None = None,
    day: int = DAY,
) -> EvaluateResult:
    """Every (horizon, risk) case; raises :class:`risk.NotEnoughWindows` when the series is too short."""
    step = series.step
    bad = [h for h in horizons if h % step]
    if bad:
        raise ValueError(
            f"horizon(s) {', '.join(format_duration(h) for h in bad)} are not multiples of the series step ({step}s)"
        )
    for r in risks:
        if not 0.0 < r < 0.5:
            raise ValueError(f"--risk {r} must be in (0, 0.5): the share of windows allowed to need more GPUs")
    n = len(series)
    for hs in horizons:
        for r in risks:
            need = minimum_points(hs // step, r)
            if n < need:
                raise rk.NotEnoughWindows(
                    f"series of {n} points of {step}s is too short for horizon {format_duration(hs)} at risk {r}: "
                    f"need at least {need} points ({rk.min_windows(r)} windows to calibrate on and as many to "
                    f"measure the risk on, each {hs // step} steps long); use a shorter horizon or a larger risk"
                )
    pool = Pool.sized(float(np.nanmax(series.values)), gpus_at_peak, capacity_per_gpu)
    init = n // 2 if initial_train is None else initial_train
    widths = rk.WidthModels()  # one history: the risks of a horizon share its width models
    cases = [evaluate_case(series, hs // step, r, pool, init, day, widths=widths) for hs in horizons for r in risks]
    return EvaluateResult(series.name, step, n, pool, init, cases)


def write_json(result: EvaluateResult, path: Path) -> None:
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n")


def plot(result: EvaluateResult, series: Series, path: Path, risk: float | None = None) -> None:
    """Per horizon at one risk: demand and the reservations in GPUs, GPUs lent, under-provisions marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = result.cases[0].risk if risk is None else risk
    cases = [c for c in result.cases if c.risk == r]
    fig, axes = plt.subplots(len(cases), 1, figsize=(15, 3.6 * len(cases)), squeeze=False)
    pool = result.pool
    hours = (np.arange(result.n_points) * result.step) / 3600.0
    for ax, c in zip(axes[:, 0], cases, strict=True):
        o = c.trace["origins"].astype(np.int64)
        grid = {k: np.full(result.n_points, np.nan) for k in ("model", "baseline", "need")}
        for k, arr in grid.items():
            arr[o] = pool.gpus_for(c.trace[k][o])  # NaN outside the evaluated origins: gaps stay gaps
        demand = series.values / pool.capacity
        best, _ = c.best_baseline()
        lo = o.min()
        sl = slice(lo, result.n_points)
        ax.plot(hours[sl], demand[sl], lw=0.7, color="black", label="demand now (GPUs)")
        ax.plot(hours[sl], grid["model"][sl], lw=0.9, color="tab:blue", label=f"model: reserve at risk {r:g}")
        ax.plot(hours[sl], grid["baseline"][sl], lw=0.9, color="tab:orange", label=f"{best} (tuned): reserve")
        lent = pool.gpus - grid["model"]
        ax.fill_between(
            hours[sl], pool.gpus, grid["model"][sl], color="tab:green", alpha=0.15, label="GPUs lent (model)"
        )
        miss = o[pool.gpus_for(c.trace["model"][o]) < pool.gpus_for(c.trace["need"][o])]
        ax.scatter(
            hours[miss],
            grid["need"][miss],
            marker="x",
            color="red",
            s=28,
            zorder=5,
            label="under-provision (window max)",
        )
        m = c.policies["model"]
        assert m is not None
        ax.set_title(
            f"{result.series}: window {format_duration(c.horizon_seconds)}, target risk {r:g}; model realized "
            f"{m.tuned.risk:.3f}, lends {m.tuned.lent:.1%} of GPU-time (mean {np.nanmean(lent[sl]):.1f} GPUs)"
        )
        ax.set_xlabel("hours since series start")
        ax.set_ylabel(f"GPUs (pool {pool.gpus})")
        ax.set_ylim(0, pool.gpus * 1.05)
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7)  # outside: no data hidden
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
