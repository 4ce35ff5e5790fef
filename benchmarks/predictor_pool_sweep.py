"""The shared (pooled) width model against per-series widths only, on the per-client series.

    python -m benchmarks.predictor_pool_sweep [--clients 12] [--margin 0.05] [--json OUT.json]

Input: the top ``--clients`` per-client series of each 14-day ServeGen dataset (m-large, m-mid;
``benchmarks.predictor_backtest_all``), at risks 1 % / 5 % and windows of 30 / 60 min, evaluated
as ``rose predictor evaluate`` does. Per (dataset, window) one width model is learnt on every
client's training half (:func:`shared_widths`); each case is
evaluated without it (``now``) and with it competing in the training-half validation
(``pooled``; evaluated again only where the validation chose it, else identical). Output on
stdout (and ``--json``): per case both ratios (model / best baseline at equal risk), and per
dataset the cases at >= 1.15, below 0.95 and the geometric mean of the ratios.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.predictor_backtest_all import all_series
from benchmarks.predictor_evaluate_all import HORIZONS, grid
from predictor import risk as rk
from predictor.evaluate import LEND_GOAL_RATIO, Pool, evaluate_case
from predictor.series import Series


def shared_widths(series: list[Series]) -> dict[str, dict[int, rk.SharedWidth]]:
    """Per per-client series, per horizon (steps): one width model learnt on the training halves
    of every client of its dataset. Leak-free: the clients share start, step and length, so every
    training half ends before every evaluated half starts (checked)."""
    groups: dict[str, list[Series]] = {}
    for s in series:
        if "/" in s.name and len(s) * s.step >= 2 * 86400:
            groups.setdefault(s.name.split("/")[0], []).append(s)
    out: dict[str, dict[int, rk.SharedWidth]] = {}
    for name, members in groups.items():
        if len({(m.start, m.step, len(m)) for m in members}) != 1:
            raise ValueError(f"{name}: clients differ in start, step or length; a shared width would read ahead")
        step, half = members[0].step, len(members[0]) // 2
        hists = [(m.values[:half], m.start) for m in members]
        models = {h // step: rk.fit_shared_width(hists, h // step, step) for h in HORIZONS}
        out.update({m.name: models for m in members})
    return out


def sweep_case(s: Series, h: int, risk: float, shared: rk.SharedWidth) -> dict[str, Any]:
    """Both ratios of one case, and which width the pooled run deployed."""
    pool = Pool.sized(float(np.nanmax(s.values)), 64, None)
    init = len(s) // 2
    widths = rk.WidthModels()  # the three fits below share the series' own width models
    now = evaluate_case(s, h, risk, pool, init, widths=widths)
    p = rk.fit_risk(s.values, h, risk, s.step, init - 1, s.start, shared, widths)
    pooled = evaluate_case(s, h, risk, pool, init, shared=shared, widths=widths) if p.shared else now
    return {
        "series": s.name,
        "horizon_seconds": h * s.step,
        "risk": risk,
        "oracle_ratio": now.to_json()["oracle_ratio"],
        "now": now.ratio(),
        "pooled": pooled.ratio(),
        "width_now": now.model_params["width"],
        "width_pooled": pooled.model_params["width"],
    }


def summarize(cases: list[dict[str, Any]]) -> list[str]:
    lines = []
    for ds in [*sorted({c["series"].split("/")[0] for c in cases}), "all"]:
        sel = [c for c in cases if ds == "all" or c["series"].startswith(ds + "/")]
        for k in ("now", "pooled"):
            r = np.array([c[k] for c in sel])
            lines.append(
                f"{ds:>8} {k:>6}: cases {len(r)}, >= {LEND_GOAL_RATIO}: {int(np.sum(r >= LEND_GOAL_RATIO))}, "
                f"< 0.95: {int(np.sum(r < 0.95))}, geometric mean {math.exp(np.mean(np.log(r))):.3f}, "
                f"pooled width deployed in {sum(c['width_pooled'].endswith('shared') for c in sel)}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=12, help="largest clients per 14-day dataset")
    ap.add_argument("--json", type=Path, help="write every case here")
    ap.add_argument("--margin", type=float, default=rk.SHARED_MARGIN, help="the shared width's validation margin")
    a = ap.parse_args(argv)
    if not -0.5 < a.margin < 1.0:
        ap.error(f"--margin {a.margin} must be in (-0.5, 1): a share of the validated reserve")
    rk.SHARED_MARGIN = a.margin
    series, _ = all_series(a.clients, 3)
    shared = shared_widths(series)
    cases = []
    for s, h, r in grid([s for s in series if s.name in shared]):
        c = sweep_case(s, h, r, shared[s.name][h])
        cases.append(c)
        print(
            f"{c['series']} {h * s.step // 60}m@{r:g}: now {c['now']:.3f} ({c['width_now']}) pooled "
            f"{c['pooled']:.3f} ({c['width_pooled']})",
            flush=True,
        )
        if a.json:
            a.json.write_text(json.dumps(cases, indent=1) + "\n")
    print("\n".join(summarize(cases)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
