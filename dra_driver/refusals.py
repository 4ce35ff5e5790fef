"""A lent claim refused because serving holds its GPU: the error, and its once-per-claim Event.

I/O boundary: none (``NodeDriver.prepare`` counts and tells). A lent claim allocated on a GPU
before serving came there (the allocations raced, or a shared claim kept an old allocation while
serving arrived) cannot be prepared while serving holds the GPU: serving wins, the prepare is
refused, and the kubelet retries it. The claim's allocation does not move by itself (for a
time-slice group's shared claim, not while any member reserves it), so the pod waits until
serving leaves that GPU. That wait is made visible once per (claim, serving claim): a warning
Event ``LentPrepareRefused`` on the claim's pods, besides the counter
``rose_driver_lent_prepare_refused_total`` (every refusal) and the log line; the kubelet's retries
add nothing more. What to do about the pod (recreate it elsewhere) is its owner's decision.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from dra_driver.claims import ClaimError, PodRef

EVENT_LENT_PREPARE_REFUSED = "LentPrepareRefused"  # warning: serving holds the lent claim's GPU
BOOK_MAX = 1024  # (claim, serving claim) pairs remembered; the oldest is forgotten first


class ServingHoldsError(ClaimError):
    """A lent claim's GPU is held by a serving claim (prepared, or being bound) on this node."""

    def __init__(self, message: str, gpu: int, serving: str, pods: Sequence[PodRef] = ()) -> None:
        super().__init__(message)
        self.gpu = gpu
        self.serving = serving  # namespace/name, or the UID of a claim being bound
        self.pods = tuple(pods)


def event_message(claim: str, node: str, e: ServingHoldsError) -> str:
    """The Event's text for the refused lent claim ``claim`` (namespace/name) on ``node``. Pure."""
    return (
        f"ResourceClaim {claim} is allocated GPU {e.gpu} of {node}, which serving claim {e.serving} holds:"
        " serving wins, so its prepare is refused until serving leaves that GPU (the kubelet retries;"
        " the allocation does not move while a pod reserves the claim). Reported once per serving claim."
    )


class RefusalBook:
    """Which (claim UID, serving claim) refusals were already told, bounded (oldest forgotten)."""

    def __init__(self, limit: int = BOOK_MAX) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()

    def first(self, claim_uid: str, serving: str) -> bool:
        """True the first time this pair is refused (tell it), False after (already told)."""
        key = (claim_uid, serving)
        if key in self._seen:
            return False
        self._seen[key] = None
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)
        return True

    def forget(self, claim_uid: str) -> None:
        """The claim was prepared or unprepared: a later refusal of it is news again."""
        for key in [k for k in self._seen if k[0] == claim_uid]:
            del self._seen[key]
