"""The one rule for what a NEW lent claim may take in a pool: the planner's grants and the extender's filter.

I/O boundary: none. A pure function of three numbers, used by ``elastic_controller.planner`` (may a
job get a new worker in a pool?) and ``scheduler_extender.policy`` (does the pool's idle window
cover a new worker's minimum useful run?), so that the two cannot disagree on it again.

The rule: **a lendable device allocated to a lent ResourceClaim is taken for every new lent claim,
whatever its worker's state**: running, resuming, suspended by a planned reclaim (its claim stays
allocated so it resumes in place), suspended or refused because serving holds its GPU. DRA gives an
allocated device to no other claim, and a suspended worker's claim keeps its device even after
serving has left. So a pool's spare GPUs for a new lent claim are its capacity, less what serving
needs (the forecast), less every GPU a lent claim is allocated on (``claimed``; the planner counts
every live worker of a pool, each granted worker too, a time-slice group's shared claim once).

What serving may take is a different question with a different count: the driver prepares serving
over a suspended occupant at once, so the planner's planned reclaims (and a suspended worker's
resume in place, which needs no new device) count only the workers that hold their GPU.

Soak finding (issue 25, group soak g6 and g1 on branch ``groupwait``): the planner counted a
suspended worker's allocated GPU as free room and granted another job's new worker there; the
extender counted it lent and refused that worker ("serving forecast ... needs pool 'pool-b' within
0s"), and the job never reached its target.
"""

from __future__ import annotations


def spare_for_new_claim(capacity: float, serving: float, claimed: float) -> float:
    """GPUs of a pool a new lent claim may still take: ``capacity`` (physical GPUs) less ``serving``
    (the GPUs serving needs or may need: now, or the forecast at a point) less ``claimed`` (every GPU
    a lent claim is allocated on, whatever its worker's state: see the module docstring). A new
    claim needing ``n`` GPUs fits when the result is at least ``n``."""
    return capacity - serving - claimed
