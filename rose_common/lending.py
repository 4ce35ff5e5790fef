"""The one rule for what a NEW lent claim may take in a pool: the planner's grants and the extender's filter.

I/O boundary: none. Pure functions of numbers, used by ``elastic_controller.planner`` (may a
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

import math
from collections.abc import Iterator, Sequence


def spare_for_new_claim(capacity: float, serving: float, claimed: float) -> float:
    """GPUs of a pool a new lent claim may still take: ``capacity`` (physical GPUs) less ``serving``
    (the GPUs serving needs or may need: now, or the forecast at a point) less ``claimed`` (every GPU
    a lent claim is allocated on, whatever its worker's state: see the module docstring). A new
    claim needing ``n`` GPUs fits when the result is at least ``n``."""
    return capacity - serving - claimed


# ---------------------------------------------------------------------------------------------
# Reading serving's forecast for a new lent claim: the planner's grants and the extender's filter
#
# Group soak g7 (branch ``suspalloc``): the planner granted ``elastic-a-w3`` in pool-b and the
# extender refused it for 100 s ("serving forecast (at risk 0.05) needs pool 'pool-b' within 0s"),
# both counting the same 3 claimed GPUs. For the same predictor reply they read it differently: the
# planner's 60 s steps over the soak's horizons of 6, 19 and 38 s gave step 0 the 38-s window's bound
# (the predictor fits each horizon's model apart, so a shorter window's bound can be the larger), while
# the extender walked every point from the first; and the planner measured horizons from the reply's
# ``generated_at``, the extender from now. Both now read a reply through the two functions below.

Points = Sequence[tuple[float, float]]


def _ahead(points: Points, age_s: float) -> Iterator[tuple[float, float]]:
    """The points still ahead, as (seconds from now, GPUs serving may need), nearest first: a point's
    horizon counts from the reply's ``generated_at``, ``age_s`` ago; one already past says nothing."""
    for horizon, demand in sorted(points):
        if horizon - age_s > 0:
            yield horizon - age_s, demand


def new_claim_room(capacity: float, claimed: float, points: Points, run_s: float, age_s: float = 0.0) -> float:
    """GPUs a new lent claim may take in a pool over its run ``[now, now + run_s]``: the least
    :func:`spare_for_new_claim` over every forecast point ahead up to and including the first that
    reaches the run's end (the forecast says nothing between points: the one after covers the gap).
    ``points``: (horizon s from the reply's ``generated_at``, GPUs serving may need: the window bound at
    the operator's risk, or the quantile); ``age_s``: now - ``generated_at``. ``-inf`` where no point
    reaches the end (nothing is known there); ``inf`` for an empty run (nothing to cover). A claim
    needing ``n`` GPUs fits where the result is at least ``n``, exactly when
    ``idle_window(capacity, claimed, points, n, age_s) >= run_s``."""
    if run_s <= 0:
        return math.inf
    least = math.inf
    for ahead, demand in _ahead(points, age_s):
        least = min(least, spare_for_new_claim(capacity, demand, claimed))
        if ahead >= run_s:
            return least
    return -math.inf


def idle_window(capacity: float, claimed: float, points: Points, need: float, age_s: float = 0.0) -> float:
    """How long from now a new lent claim of ``need`` GPUs stays clear of serving's forecast: the
    seconds ahead of the last point of the longest run of points, from the nearest on, that each leave
    it room (:func:`spare_for_new_claim` ≥ ``need``); 0 when the nearest does not. Same points and age
    as :func:`new_claim_room`, with which it agrees: ``idle_window(...) >= run`` ⇔ ``new_claim_room(..., run)
    >= need``."""
    window = 0.0
    for ahead, demand in _ahead(points, age_s):
        if spare_for_new_claim(capacity, demand, claimed) < need:
            break
        window = ahead
    return window
