"""How closely the model's realized risk tracks the target for each online step of ACI.

    python -m benchmarks.predictor_aci_sweep [--clients 3] [--holdout K] [--settings A,B] [--json OUT.json]

Input: the derived 14-day ServeGen series (m-large, m-mid) and the top ``--clients`` per-client
series of each ServeGen dataset (``benchmarks.predictor_backtest_all``), at risks 1 % / 5 % and
windows of 30 / 60 min, evaluated as ``rose predictor evaluate`` does (pool: the peak needs 64
GPUs; training: the first half). Output: per step setting, the realized-risk error
``|realized / target - 1|`` (mean, median, cases within +-30 %), the share of the pool's
GPU-time lent as deployed and at exactly the target risk, and what a perfectly calibrated
policy with the same miss runs would show (``predictor.evaluate.perfect_policy``: expected
error, expected cases within +-30 %), on stdout (and ``--json``). The model is fitted once per case; only
:data:`predictor.risk.ACI_GAMMA` changes between settings (``track_q`` reads it per call).
A per-horizon setting scales the step with the window length ``h`` (in steps): ``x4/(h+1)``
divides it by the number of overlapping windows one burst can miss (equal at 30 min).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.predictor_backtest_all import all_series
from benchmarks.predictor_evaluate_all import RISKS, grid
from predictor import risk as rk
from predictor.evaluate import (
    RISK_TOLERANCE,
    Pool,
    clustered_miss_pmf,
    knob_at_risk,
    miss_runs,
    perfect_policy,
    score,
)
from predictor.series import Series

SETTINGS = (
    "0.0005",
    "0.001",
    "0.002",
    "0.005",
    "0.01",
    "0.02",
    "0.002x4/(h+1)",
    "0.005x4/(h+1)",
    "0.002x(h+1)/4",
)


def gamma_for(setting: str, h: int) -> float:
    """The ACI step a setting gives at a window of ``h`` steps."""
    base, _, scale = setting.partition("x")
    g = float(base)
    if scale == "4/(h+1)":
        return g * 4 / (h + 1)
    if scale == "(h+1)/4":
        return g * (h + 1) / 4
    return g


def sweep_case(series: Series, h: int, risk: float, settings: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Realized risk and lent share as deployed, per setting, for one series, window and risk."""
    y, t0 = series.values, series.start
    n = len(y)
    init = n // 2
    wm = rk.window_max(y, h)
    ok = ~np.isnan(wm) & ~np.isnan(y)
    pool = Pool.sized(float(np.nanmax(y)), 64, None)
    params = rk.fit_risk(y, h, risk, series.step, init - 1, t0)
    saved = rk.ACI_GAMMA
    out = {}
    try:
        for s in settings:
            rk.ACI_GAMMA = gamma_for(s, h)
            q = rk.track_q(params, y, init, n, t0)
            res = rk.bound(params, y, q, 0.0, t0)
            test = np.flatnonzero(ok & (np.arange(n) >= init) & ~np.isnan(res))
            lent_eq, runs = _at_equal_risk(params, y, q, test, pool, t0)
            out[s] = {**_scored(pool, res[test], wm[test]), "lent_at_equal_risk": lent_eq, **_perfect(test, risk, runs)}
    finally:
        rk.ACI_GAMMA = saved
    return out


def _scored(pool: Pool, reserve: np.ndarray, need: np.ndarray) -> dict[str, float]:
    sc = score(pool, reserve, need, 0.0)
    return {"realized_risk": sc.risk, "lent_share": sc.lent}


def _at_equal_risk(
    p: rk.RiskParams, y: np.ndarray, q: np.ndarray, test: np.ndarray, pool: Pool, t0: int
) -> tuple[float, list[int]]:
    """Lent share with ``q`` shifted until the realized risk is the target (as evaluate does), and
    the runs of its misses."""
    wm = rk.window_max(y, p.horizon)
    k = knob_at_risk(rk.threshold_shift(p, y, q, pool.shortfall_limit(wm), t0)[test], p.risk)
    reserve = rk.bound(p, y, q, k, t0)[test]
    runs = miss_runs(test, pool.gpus_for(reserve) < pool.gpus_for(wm[test]))
    return _scored(pool, reserve, wm[test])["lent_share"], runs


def _perfect(test: np.ndarray, risk: float, runs: list[int]) -> dict[str, float]:
    """A perfectly calibrated policy with these miss runs: expected |realized / target - 1| and
    the probability that it lands within the tolerance (the floor the model is judged against)."""
    n = len(test)
    pmf = clustered_miss_pmf(n, risk, runs)
    return {
        "perfect_abs_err": float(np.sum(pmf * np.abs(np.arange(n + 1) / n / risk - 1.0))),
        "perfect_within": perfect_policy(n, risk, runs)["p_within_tolerance"],
    }


def summarize(cases: list[dict[str, Any]], settings: tuple[str, ...]) -> list[str]:
    lines = [
        f"{'setting':>15} {'cases':>5} {'mean |err|':>10} {'median |err|':>12} {'mean err':>8} {'within':>6} "
        f"{'mean lent':>9} {'at eq. risk':>11} {'perfect |err|':>13} {'perfect within':>14}"
        "   (per risk: mean |err| / mean lent)"
    ]
    for s in settings:
        signed = np.array([c["settings"][s]["realized_risk"] / c["risk"] - 1 for c in cases])
        err = np.abs(signed)
        eq = np.array([c["settings"][s]["lent_at_equal_risk"] for c in cases])
        p_err = np.mean([c["settings"][s]["perfect_abs_err"] for c in cases])
        p_in = sum(c["settings"][s]["perfect_within"] for c in cases)
        lent = np.array([c["settings"][s]["lent_share"] for c in cases])
        per = "  ".join(
            f"{r:g}: {np.mean(err[m]):.3f} / {np.mean(lent[m]):.4f}"
            for r in RISKS
            for m in [np.array([c["risk"] == r for c in cases])]
        )
        lines.append(
            f"{s:>15} {len(cases):>5} {np.mean(err):>10.3f} {np.median(err):>12.3f} {np.mean(signed):>8.3f} "
            f"{int(np.sum(err <= RISK_TOLERANCE)):>6} {np.mean(lent):>9.4f} {np.mean(eq):>11.4f} {p_err:>13.3f} "
            f"{p_in:>14.1f}   {per}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=3, help="largest clients per 14-day dataset")
    ap.add_argument("--json", type=Path, help="write every case and setting here")
    ap.add_argument(
        "--holdout", type=int, default=0, help="only the per-client series ranked after the top HOLDOUT (no derived)"
    )
    ap.add_argument("--settings", help=f"comma-separated subset of {', '.join(SETTINGS)} (default: all)")
    a = ap.parse_args(argv)
    settings = SETTINGS if not a.settings else tuple(a.settings.split(","))
    unknown = [x for x in settings if x not in SETTINGS]
    if unknown:
        ap.error(f"--settings: unknown {', '.join(unknown)}; choose from {', '.join(SETTINGS)}")
    if not 0 <= a.holdout < a.clients:
        ap.error(f"--holdout {a.holdout}: give 0, or fewer clients than --clients {a.clients}")
    series, _ = all_series(a.clients - a.holdout, 3, skip=a.holdout)
    series = [s for s in series if len(s) * s.step >= 2 * 86400]  # the 14-day series only
    cases = []
    for s, h, r in grid(series):
        res = sweep_case(s, h, r, settings)
        cases.append({"series": s.name, "horizon_seconds": h * s.step, "risk": r, "settings": res})
        print(s.name, h * s.step // 60, r, {k: round(v["realized_risk"], 4) for k, v in res.items()}, flush=True)
    print("\n".join(summarize(cases, settings)))
    if a.json:
        a.json.write_text(json.dumps(cases, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
