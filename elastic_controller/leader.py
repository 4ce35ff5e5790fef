"""Leader election for the controller: :mod:`rose_common.leader` (pure; shared with timeslice).

I/O boundary: none.
"""

from rose_common.leader import Decision, LeaseRecord, decide

__all__ = ["Decision", "LeaseRecord", "decide"]
