"""The node agent's fencing book: :func:`dra_driver.fencing.admit` behind a lock.

The agent's default fence when the driver does not hand it the node's crash-safe one
(``dra_driver/node.py`` keeps the book in its checkpoint). The decision is
:mod:`dra_driver.fencing`'s (pure); this module only serialises the callers.
"""

from __future__ import annotations

import threading
from collections.abc import Collection

from dra_driver.fencing import Verdict, admit


class FenceBook:
    """The last token seen per group, thread-safe and bounded; :meth:`admit` judges and records."""

    def __init__(self, last_seen: dict[str, int] | None = None) -> None:
        self._mu = threading.Lock()
        self.last_seen: dict[str, int] = dict(last_seen or {})

    def admit(self, raw: str, in_use: Collection[str] = ()) -> Verdict:
        with self._mu:
            return admit(self.last_seen, raw, in_use)
