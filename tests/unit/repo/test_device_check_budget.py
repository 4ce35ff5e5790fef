"""``hack/device-check.sh`` promises the whole GPU check within 10 minutes: its steps' timeouts must
add up to at most 540 s (a minute of the ten left for start-up), and its header must state them."""

from __future__ import annotations

import re
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "hack" / "device-check.sh"
BUDGET_S = 540


def _timeouts(text: str) -> list[int]:
    """The ``timeout N`` of every command the script runs (comments left out)."""
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return [int(n) for n in re.findall(r"(?:^|[\s;(])timeout (\d+) ", code, re.MULTILINE)]


def test_the_steps_timeouts_fit_in_the_budget() -> None:
    timeouts = _timeouts(SCRIPT.read_text())
    assert len(timeouts) >= 5, f"expected a timeout on every step, found {timeouts}"
    assert sum(timeouts) <= BUDGET_S, f"device-check.sh timeouts {timeouts} add up to {sum(timeouts)} s > {BUDGET_S} s"


def test_the_header_states_the_timeouts_it_runs() -> None:
    text = SCRIPT.read_text()
    timeouts = _timeouts(text)
    stated = " + ".join(str(t) for t in timeouts) + f" = {sum(timeouts)} s"
    header = " ".join(line.lstrip("# ") for line in text.splitlines()[:6])
    assert stated in header, f"the header should say {stated!r}"


def test_timeouts_are_found_in_commands_only() -> None:
    assert _timeouts("# timeout 900 in a comment\ntimeout 10 a\n  timeout 20 b \\\n{ timeout 30 c; }") == [10, 20, 30]
