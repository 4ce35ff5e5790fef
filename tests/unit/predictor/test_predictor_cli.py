"""The CLI's generate command, environment twins of flags, and the replay source."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from predictor.cli import main
from predictor.generator import generate
from predictor.replay import ReplaySource
from predictor.series import read_series_csv


def test_generate_writes_a_readable_deterministic_csv(tmp_path: Path) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    assert main(["generate", "--days", "2", "--step", "300", "--out", str(a)]) == 0
    assert main(["generate", "--days", "2", "--step", "300", "--out", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()
    s = read_series_csv(a)
    assert s.step == 300 and len(s) == 576
    np.testing.assert_allclose(s.values, generate(2, 300).values, rtol=1e-6)


def test_flags_have_environment_twins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "env.csv"
    monkeypatch.setenv("ROSE_PREDICTOR_OUT", str(out))
    monkeypatch.setenv("ROSE_PREDICTOR_DAYS", "1")
    monkeypatch.setenv("ROSE_PREDICTOR_STEP", "600")
    assert main(["generate"]) == 0
    assert len(read_series_csv(out)) == 144


def test_help_names_the_environment_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["backtest", "--help"])
    text = capsys.readouterr().out
    for flag in ("--series", "--horizons", "--quantile", "--json", "--plot"):
        assert flag in text
    assert "ROSE_PREDICTOR_SERIES" in text


def test_bad_generate_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--days", "0", "--out", str(tmp_path / "x.csv")]) == 2
    assert "must be positive" in capsys.readouterr().err


def test_replay_source_places_the_series_before_now() -> None:
    s = generate(1, 60)
    now = 2_000_000_040.0  # a whole minute
    src = ReplaySource(s, clock=lambda: now)
    got = src.range("ignored", int(now) - 600, int(now), 60)
    np.testing.assert_allclose(got.values[-1], s.values[-1])
    np.testing.assert_allclose(got.values[:-1], s.values[-11:-1])
    with pytest.raises(ValueError, match="--step 60s"):
        src.range("q", 0, 600, 30)


@pytest.mark.slow
def test_backtest_cli_writes_json_table_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv_path = tmp_path / "g.csv"
    assert main(["generate", "--days", "8", "--step", "3600", "--out", str(csv_path)]) == 0
    out, png = tmp_path / "o.json", tmp_path / "o.png"
    args = ["--horizons", "1h", "--quantile", "0.8", "--json", str(out), "--plot", str(png), "--refit-every", "3d"]
    rc = main(["backtest", "--series", str(csv_path), *args])
    assert rc == 0
    table = capsys.readouterr().out
    assert "persistence" in table and "cov@0.8" in table
    import json

    data = json.loads(out.read_text())
    assert set(data["horizons"]) == {"1h"}
    assert data["quantile"] == 0.8
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
