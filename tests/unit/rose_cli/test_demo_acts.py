"""``rose demo --acts``: which acts run (``rose_cli.demo.parse_acts``, pure), and a bad list is one
clear line from the real command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rose_cli.demo import ACTS, parse_acts


def test_acts_are_parsed_and_act_1_always_runs() -> None:
    assert parse_acts("1,6") == {1, 6}
    assert parse_acts("6") == {1, 6}  # the cluster is act 1
    assert parse_acts(" 2 , 4,") == {1, 2, 4}
    assert parse_acts(",".join(map(str, ACTS))) == set(ACTS)


@pytest.mark.parametrize(("text", "says"), [("7", "no act [7]"), ("one", "a comma-separated list")])
def test_a_bad_act_list_is_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=r"--acts: ") as e:
        parse_acts(text)
    assert says in str(e.value)


def test_rose_demo_refuses_a_bad_act_list_in_one_line() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "rose_cli", "demo", "--acts", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("rose demo: error: --acts: no act [0]"), r.stderr
