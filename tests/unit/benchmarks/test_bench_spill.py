"""benchmarks.spill end to end at a tiny size: the report's shape, bit-exactness, bad flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import spill


def test_tiny_run_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert (
        spill.main(
            ["--dir", str(tmp_path), "--sizes-mib", "1", "--repeats", "1", "--chunk-mib", "1", "--json", str(out)]
        )
        == 0
    )
    rep = json.loads(out.read_text())
    (row,) = rep["results"]
    assert row["bit_exact"] is True and rep["all_bit_exact"] is True
    for k in (
        "spill_gbps",
        "restore_cold_gbps",
        "baseline_write_fsync_gbps",
        "baseline_read_cold_gbps",
        "blake2b_only_gbps",
    ):
        assert row[k] > 0, k
    assert [p for p in tmp_path.iterdir() if p.name != "r.json"] == []  # its folder is removed


@pytest.mark.parametrize(
    "flags", [["--sizes-mib", "0"], ["--sizes-mib", "a"], ["--repeats", "0"], ["--chunk-mib", "0"]]
)
def test_bad_flags_exit_with_usage(flags: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        spill.main(flags)
    assert e.value.code == 2
