"""How predictable are the 14-day traces at all? An optimistic bound with look-ahead.

    python -m benchmarks.predictor_bound

For each derived 14-day ServeGen series and horizon, a ridge regression on the predictor's own
features is fit IN-SAMPLE on the second week (it sees the very points it is scored on, so it
can only flatter itself) and its WAPE compared with persistence on the same points. If even
this bound stays near persistence, no honest model on these features can reach 0.8x.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from sklearn.linear_model import Ridge

from predictor.features import FeatureSpec, Transform, build_features, targets
from predictor.series import read_series_csv

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    tdir = Path(os.environ.get("ROSE_TRACES_DIR", REPO.parent / "shared" / "data" / "traces"))
    print("| series | horizon | in-sample ridge WAPE | persistence WAPE | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for name in ("servegen_m-large_10min.csv", "servegen_m-mid_10min.csv"):
        s = read_series_csv(tdir / "derived" / name)
        tr = Transform.fit(s.values)
        z = tr.forward(s.values)
        t = s.times.astype(np.float64)
        week = 7 * 86400 // s.step
        for h in (1, 3, 6):
            x = build_features(z, t, h, FeatureSpec(step=s.step))
            tg = targets(z, h)
            ok = ~np.isnan(tg) & ~np.isnan(x).any(axis=1)
            ok[:week] = False
            m = Ridge(alpha=1.0).fit(x[ok], tg[ok])
            pred = tr.inverse(z[ok] + m.predict(x[ok]))
            idx = np.flatnonzero(ok)
            act = s.values[idx + h]
            per = s.values[idx]
            w_model = float(np.sum(np.abs(act - pred)) / np.sum(act))
            w_per = float(np.sum(np.abs(act - per)) / np.sum(act))
            print(f"| {s.name} | {h * s.step // 60}m | {w_model:.4f} | {w_per:.4f} | {w_model / w_per:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
