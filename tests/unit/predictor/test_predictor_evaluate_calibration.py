"""What a perfectly calibrated policy realizes when misses come in runs (predictor.evaluate)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks.predictor_backtest_all import all_series, servegen_clients
from benchmarks.predictor_evaluate_all import main
from predictor.evaluate import binomial_band, clustered_miss_pmf, evaluate, miss_runs, perfect_policy
from predictor.generator import generate


def test_miss_runs_end_at_a_covered_origin_or_a_gap() -> None:
    origins = np.array([1, 2, 3, 5, 6, 9, 10])
    missed = np.array([True, True, False, True, True, True, False])
    assert miss_runs(origins, missed) == [2, 2, 1]  # 6 and 9 are not adjacent: a gap between them
    assert miss_runs(origins, np.zeros(7, dtype=bool)) == []


def test_runs_of_three_by_hand() -> None:
    """300 windows, risk 1 %, every run 3 long: K ~ Binomial(300, 1/300) events, 3K misses.
    Within +-30 % of 0.01 (3 misses of 300) only K = 1: P = (299/300)^299. P(K <= 2) = 0.920 <
    0.95 <= P(K <= 3) = 0.981, so the 95 % point is 9 misses (0.03); P(K = 0) = 0.367 > 0.05."""
    p = perfect_policy(300, 0.01, [3, 3])
    assert p["p_within_tolerance"] == pytest.approx((299 / 300) ** 299, rel=1e-9)
    assert p["interval_5_95"] == [0.0, 0.03]
    pmf = clustered_miss_pmf(300, 0.01, [3])
    k = np.arange(4)
    by_hand = [math.comb(300, i) * (1 / 300) ** i * (299 / 300) ** (300 - i) for i in k]
    np.testing.assert_allclose(pmf[3 * k], by_hand, rtol=1e-9)
    assert pmf[1] == pmf[2] == 0.0


def test_single_window_runs_are_the_binomial_band() -> None:
    for n, r in ((950, 0.01), (1000, 0.05)):
        assert perfect_policy(n, r, [1, 1])["interval_5_95"] == binomial_band(n, r)
        assert perfect_policy(n, r, [])["interval_5_95"] == binomial_band(n, r)


def test_matches_a_seeded_simulation_of_miss_events() -> None:
    """Miss events at each of 500 origins with probability risk / mean run, each a run drawn
    from the observed lengths: the simulated share within +-30 % and the 5-95 % points match."""
    n, risk, runs = 500, 0.05, [1, 2, 2, 6]
    rng = np.random.default_rng(7)
    events = rng.random((20_000, n)) < risk / np.mean(runs)
    lengths = rng.choice(runs, size=events.shape)
    share = np.minimum((events * lengths).sum(axis=1), n) / n
    p = perfect_policy(n, risk, runs)
    assert abs(np.mean(share) - risk) < 0.001
    assert abs(np.mean(np.abs(share - risk) / risk <= 0.3) - p["p_within_tolerance"]) < 0.015
    lo, hi = p["interval_5_95"]
    assert np.mean(share < lo) <= 0.05 <= np.mean(share <= lo) + 0.01
    assert np.mean(share < hi) <= 0.95 + 0.01 and np.mean(share <= hi) >= 0.95


def test_longer_runs_widen_the_interval_and_lower_the_chance_to_land_within_tolerance() -> None:
    single, runs4 = perfect_policy(1000, 0.01, [1]), perfect_policy(1000, 0.01, [4])
    assert (
        runs4["interval_5_95"][1] - runs4["interval_5_95"][0] > single["interval_5_95"][1] - single["interval_5_95"][0]
    )
    assert runs4["p_within_tolerance"] < single["p_within_tolerance"]


def test_bad_input_says_what_to_fix() -> None:
    with pytest.raises(ValueError, match="at least one"):
        clustered_miss_pmf(0, 0.01, [1])
    with pytest.raises(ValueError, match="must be >= 1"):
        clustered_miss_pmf(10, 0.01, [0, 2])


def test_every_case_reports_the_perfect_policy_and_whether_the_model_is_consistent() -> None:
    s = generate(days=8, step=600, seed=4)
    for c in evaluate(s, [1800], [0.01, 0.05], gpus_at_peak=64).to_json()["cases"]:
        pp = c["perfect_policy"]
        lo, hi = pp["interval_5_95"]
        realized = c["policies"]["model"]["as_tuned"]["realized_risk"]
        assert lo <= c["risk"] <= hi and 0.0 < pp["p_within_tolerance"] < 1.0
        assert c["goals"]["risk_consistent"] == (lo <= realized <= hi)
        assert sum(pp["miss_runs"]) == round(c["policies"]["model"]["at_equal_risk"]["realized_risk"] * c["n_eval"])
        assert sum(pp["model_miss_runs"]) == round(realized * c["n_eval"])


def test_the_benchmark_table_judges_each_case_against_the_perfect_policy() -> None:
    from benchmarks.predictor_evaluate_all import markdown

    s = generate(days=8, step=600, seed=4)
    doc = evaluate(s, [1800], [0.01, 0.05], gpus_at_peak=64).to_json()
    cases = doc["cases"]
    cases[0]["goals"]["risk_met"] = False  # one goal miss outside its interval, one inside
    cases[0]["policies"]["model"]["as_tuned"]["realized_risk"] = 1.0
    cases[0]["goals"]["risk_consistent"] = False
    cases[1]["goals"]["risk_met"], cases[1]["goals"]["risk_consistent"] = False, True
    text = markdown([{**doc, "series": "gen"}], [], "--out X")
    rows = [line for line in text.splitlines() if line.startswith("| gen |")]
    assert len(rows) == 2 and rows[0].endswith(" c |") and rows[1].endswith(" C |")
    expected = sum(c["perfect_policy"]["p_within_tolerance"] for c in cases)
    assert f"there in {expected:.1f} of 2 cases" in text and "the model does in 0." in text
    assert "missed in 2 of 2 cases" in text and "1 lie inside the perfect policy's" in text
    assert "* 1 above it" in text and "gen 30m@0.01 (1.000 vs" in text and "* 0 below it" in text


def test_aci_sweep_settings_scale_the_step_with_the_window() -> None:
    from benchmarks.predictor_aci_sweep import gamma_for

    assert gamma_for("0.002", 6) == 0.002
    assert gamma_for("0.002x(h+1)/4", 3) == pytest.approx(0.002) and gamma_for("0.002x(h+1)/4", 6) == pytest.approx(
        0.0035
    )
    assert gamma_for("0.005x4/(h+1)", 6) == pytest.approx(0.005 * 4 / 7)


def test_rerendering_a_json_without_the_perfect_policy_says_to_rerun(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks.predictor_evaluate_all import main

    old = tmp_path / "old.json"
    old.write_text(json.dumps({"datasets": [], "results": [{"series": "s", "cases": [{"risk": 0.01}]}]}))
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "o.md"), "--from-json", str(old)])
    assert e.value.code == 2 and "no perfect_policy per case" in capsys.readouterr().err


def test_the_held_out_set_is_the_next_clients_and_no_derived_series(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--skip-clients K``: clients K+1.. of each dataset by volume, never the derived series."""
    ds = tmp_path / "servegen" / "language" / "m-large"
    ds.mkdir(parents=True)
    for k, volume in enumerate([5.0, 9.0, 1.0, 7.0, 3.0]):
        (ds / f"chunk-{k}-trace.csv").write_text("".join(f"{i},{volume}\n" for i in range(4)))
    top = [s.name for s in servegen_clients(ds, 4, 3)[0]]
    assert top == ["m-large/chunk-1-trace", "m-large/chunk-3-trace", "m-large/chunk-0-trace", "m-large/chunk-4-trace"]
    assert [s.name for s in servegen_clients(ds, 2, 3, skip=2)[0]] == top[2:4]
    (tmp_path / "derived").mkdir()
    (tmp_path / "servegen" / "language" / "m-mid").mkdir()
    (tmp_path / "servegen" / "language" / "m-mid" / "chunk-0-trace.csv").write_text(
        "0,1\n1,1\n"
    )  # one client: none left
    (tmp_path / "derived" / "x.csv").write_text("timestamp,value\n0,1\n60,2\n")
    monkeypatch.setenv("ROSE_TRACES_DIR", str(tmp_path))
    held_out, _ = all_series(2, 3, skip=2)
    assert [s.name for s in held_out] == top[2:4], "no derived series in a held-out set"


def test_a_negative_skip_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "x.md"), "--skip-clients", "-1"])
    assert "--skip-clients -1: give 0 or a positive number of clients" in capsys.readouterr().err
