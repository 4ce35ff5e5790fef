"""Absurd flag values are a one-line error and exit status 2, never a traceback (issue 11, Low)."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from predictor.cli import main

HUGE = "9" * 400


@pytest.fixture
def pools(tmp_path: Path) -> Path:
    p = tmp_path / "pools.yaml"
    p.write_text("pools:\n- name: a\n  query: q\n")
    return p


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--step", HUGE + "s"], "argument --step: '9999999999999999999999999999999999999999' is too large"),
        (["--step", "2d"], "argument --step: '2d' is too long: at most 1d"),
        (["--history", "99999999999d"], "argument --history: '99999999999d' is too long: at most 400d"),
        (["--retrain-interval", HUGE], "argument --retrain-interval: .* is too large"),
        (["--max-model-age", "401d"], "argument --max-model-age: '401d' is too long: at most 400d"),
        (["--max-model-age=1w1d"], "argument --max-model-age: bad duration .1w1d."),
        (["--listen", "0.0.0.0:99999"], "argument --listen: not HOST:PORT"),
        (["--max-connections-per-client", "0"], "argument --max-connections-per-client: '0' is out of range"),
        (["--max-connections", HUGE], "argument --max-connections: .* is out of range: use 1..65536"),
        (["--idle-timeout", "2h"], "argument --idle-timeout: '2h' is too long: at most 1h"),
    ],
)
def test_absurd_serve_flags_are_refused_by_the_parser(
    pools: Path, capsys: pytest.CaptureFixture[str], flags: list[str], match: str
) -> None:
    with pytest.raises(SystemExit) as e:
        main(["serve", "--pools", str(pools), *flags])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.search(match, err.splitlines()[-1]), err


def test_absurd_horizons_are_one_line_errors(pools: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--pools", str(pools), "--horizons", HUGE + "m"]) == 2
    assert "a horizon is too large (at most 7d)" in capsys.readouterr().err
    csv = tmp_path / "s.csv"
    assert main(["generate", "--days", "1", "--out", str(csv)]) == 0
    assert main(["backtest", "--series", str(csv), "--json", str(tmp_path / "b.json"), "--horizons", HUGE + "m"]) == 2
    assert "a horizon is too large" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--step", "99999999999999999999999"], "argument --step: .* is out of range: use 1..86400"),
        (["--days", "100000", "--step", "1"], "8.64e\\+09 points; at most 10,000,000"),
    ],
)
def test_absurd_generate_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], match: str
) -> None:

    try:
        code = main(["generate", "--out", str(tmp_path / "g.csv"), *flags])
    except SystemExit as e:
        code = e.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and re.search(match, err.splitlines()[-1]), err


def test_a_listen_address_that_cannot_be_bound_is_one_line(pools: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--pools", str(pools), "--replay", "generated", "--listen", f"127.0.0.1:{port}"]) == 2
    assert f"error: cannot listen on --listen 127.0.0.1:{port}: Address already in use" in capsys.readouterr().err
    assert main(["serve", "--pools", str(pools), "--replay", "generated", "--listen", "999.1.1.1:8080"]) == 2
    assert "error: cannot listen on --listen 999.1.1.1:8080" in capsys.readouterr().err
