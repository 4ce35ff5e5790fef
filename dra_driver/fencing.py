"""Fencing of time-slice hand-overs on the node: the last token seen per group. Pure: no I/O.

The orchestrator's hand-over carries ``rose.io/fencing-token: "<group>:<token>"`` (on the pod's
suspend-request path, or in the agent's NodeControl request). :meth:`FenceBook.admit` accepts a
token not older than the last one seen for its group and remembers it; an older one is refused,
so an orchestrator that lost its lease (a stale replica, a dead holder's late command) can never
drive a hand-over. The driver keeps the book in its crash-safe checkpoint (``state.py``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from rose_common import names


@dataclass(frozen=True)
class Verdict:
    ok: bool
    group: str
    token: int
    last: int  # the last token seen for the group before this one (0: none)

    def message(self) -> str:
        if self.ok:
            return f"fencing token {self.token} of group {self.group!r} accepted"
        return (
            f"fencing token {self.token} of group {self.group!r} is older than {self.last}, the last this node saw:"
            " the command comes from a stale orchestrator and is refused"
        )


def judge(last_seen: dict[str, int], raw: str) -> Verdict:
    """The verdict on ``raw`` ("<group>:<token>") against ``last_seen``; ValueError if malformed."""
    group, token = names.parse_fencing_token(raw)
    last = last_seen.get(group, 0)
    return Verdict(token >= last, group, token, last)


class FenceBook:
    """The last token seen per group, thread-safe; :meth:`admit` judges and records."""

    def __init__(self, last_seen: dict[str, int] | None = None) -> None:
        self._mu = threading.Lock()
        self.last_seen: dict[str, int] = dict(last_seen or {})

    def admit(self, raw: str) -> Verdict:
        with self._mu:
            v = judge(self.last_seen, raw)
            if v.ok:
                self.last_seen[v.group] = v.token
            return v
