"""The active world of an elastic job, as its workers learn it through the node agent.

Pure data: no I/O. The controller writes ``rose.io/world`` = "active/total" on each worker pod;
the node agent pushes it to the workload (``COMMAND_KIND_WORLD``) and ``Workload.safe_point``
runs the ``on_world_change`` callbacks with a :class:`World` on the training thread.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class World:
    """``active`` workers run now, out of ``total`` (active, suspended and pending)."""

    active: int
    total: int

    def __post_init__(self) -> None:
        if not 0 <= self.active <= self.total or self.total < 1:
            raise ValueError(f"a world needs 0 <= active <= total and total >= 1, got {self.active}/{self.total}")

    def share(self, global_n: int) -> int:
        """This worker's part of ``global_n`` items (episodes, environments, a batch) split over the
        active workers, rounded up so the job keeps at least ``global_n``; at least 1."""
        if global_n < 1:
            raise ValueError(f"global_n must be >= 1, got {global_n}")
        return max(1, -(-global_n // max(1, self.active)))

    def __str__(self) -> str:
        return f"{self.active}/{self.total}"
