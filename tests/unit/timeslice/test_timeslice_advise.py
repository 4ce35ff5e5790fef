"""``rose timeslice advise``: the pure model and the command."""

from __future__ import annotations

from pathlib import Path

import pytest

from timeslice import advise
from timeslice.cli import main


def test_complementary_phases_pay() -> None:
    a = advise.advise({"a": [(1.0, 1.0)] * 3, "b": [(1.0, 1.0)] * 3}, switch_s=0.05)
    assert a.pays and a.best_solo_duty == pytest.approx(0.5)
    assert a.shared_duty == pytest.approx(2.0 / 2.1)


def test_switch_longer_than_the_idle_window_does_not_pay() -> None:
    a = advise.advise({"a": [(1.0, 0.2)], "b": [(1.0, 0.2)]}, switch_s=0.5)
    assert not a.pays and "not longer than one switch" in a.reason


def test_gpu_bound_jobs_gain_nothing() -> None:
    a = advise.advise({"a": [(9.0, 1.0)], "b": [(9.0, 1.0)]}, switch_s=0.1)
    assert not a.pays and "under 1.2x" in a.reason


def test_command_reads_csv_and_exits_by_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.csv"
    f.write_text("job,gpu_s,off_s\na,1,1\nb,1.2,0.8\na,1,1\n")
    assert main(["advise", str(f), "--switch-cost", "50ms"]) == 0
    assert "PAYS" in capsys.readouterr().out


def test_bad_rows_say_what_to_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.json"
    f.write_text('[{"job": "a", "gpu_s": 1}]')
    assert main(["advise", str(f), "--switch-cost", "1"]) == 2
    assert "each row needs job, gpu_s and off_s" in capsys.readouterr().err
