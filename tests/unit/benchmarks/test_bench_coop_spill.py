"""benchmarks.coop_spill end to end at a tiny size: every phase measured, bit-exact, bad flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import coop_spill


def test_tiny_run_reports_every_phase(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert coop_spill.main(["--dir", str(tmp_path), "--sizes-mib", "1", "--repeats", "1", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    (row,) = rep["results"]
    assert row["bit_exact"] is True and rep["all_bit_exact"] is True
    for k in ("sdk_write_gbps", "driver_verify_gbps", "load_cold_gbps"):
        assert row[k] > 0, k
    assert [p for p in tmp_path.iterdir() if p.name != "r.json"] == []


@pytest.mark.parametrize("flags", [["--sizes-mib", "0"], ["--sizes-mib", "a"], ["--repeats", "0"]])
def test_bad_flags_exit_with_usage(flags: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        coop_spill.main(flags)
    assert e.value.code == 2
