"""rose_common.kwatch: raw watch lines → (type, object), errors named."""

from __future__ import annotations

import json

import pytest

from rose_common import kwatch
from rose_common.kube.errors import Gone


def test_events_are_parsed_in_order_and_blank_lines_skipped() -> None:
    lines = [
        json.dumps({"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "1"}}}),
        "",
        "  ",
        json.dumps({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}}).encode(),
        json.dumps({"type": "DELETED", "object": {"metadata": {"name": "a"}}}),
    ]
    got = list(kwatch.events(lines))
    assert [t for t, _ in got] == ["ADDED", "BOOKMARK", "DELETED"]
    assert got[0][1]["metadata"]["name"] == "a"


def test_an_error_event_raises_with_its_status() -> None:
    gone = json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}})
    events = kwatch.events([json.dumps({"type": "ADDED", "object": {}}), gone])
    assert next(events)[0] == "ADDED"
    with pytest.raises(Gone) as err:
        next(events)
    assert err.value.code == kwatch.HTTP_GONE and err.value.status.message == "too old"


@pytest.mark.parametrize("line", ['{"type": "ADDED"}', "[1, 2]", '{"type": 3, "object": {}}'])
def test_a_line_that_is_not_a_watch_event_is_refused(line: str) -> None:
    with pytest.raises(ValueError, match="not a watch event"):
        list(kwatch.events([line]))
