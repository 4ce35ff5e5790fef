"""rose_sdk's world and report values without an agent: shares, checks, a no-op report."""

from __future__ import annotations

import pytest
import torch

from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_sdk import Workload, World


def test_share_splits_the_global_count_over_the_active_workers_rounding_up() -> None:
    assert [World(a, 4).share(8) for a in (1, 2, 3, 4)] == [8, 4, 3, 2]
    assert World(0, 4).share(8) == 8  # nobody active (a gang suspend): a worker resuming alone does all
    assert World(4, 4).share(1) == 1
    with pytest.raises(ValueError, match="global_n must be >= 1"):
        World(1, 1).share(0)
    for a, t in ((3, 2), (-1, 2), (0, 0)):
        with pytest.raises(ValueError, match="0 <= active <= total"):
            World(a, t)


def test_world_commands_run_the_callbacks_once_per_change() -> None:
    wl = Workload(model=torch.nn.Linear(1, 1), socket_path="")
    seen: list[World] = []
    wl.on_world_change(seen.append)
    for active, total in ((2, 4), (2, 4), (5, 4), (1, 4)):  # a repeat and a malformed one change nothing
        wl._handle(pb.Command(kind=pb.COMMAND_KIND_WORLD, world_active=active, world_total=total))
    assert seen == [World(2, 4), World(1, 4)] and wl.world == World(1, 4) and wl.world_changes == 2


def test_report_without_an_agent_checks_its_values_and_sends_nothing() -> None:
    wl = Workload(model=torch.nn.Linear(1, 1), socket_path="")
    assert not wl.report("train", seconds_to_safe_point=2.0, steps=3, samples=30)
    wl.add_progress(steps=1, samples=10, tokens=100)
    p = wl.progress
    assert (p.phase, p.steps, p.samples, p.tokens) == ("train", 4, 40, 100)
    with pytest.raises(ValueError, match="samples must be >= 0"):
        wl.report(samples=-1)
    with pytest.raises(ValueError, match="seconds_to_safe_point"):
        wl.report(seconds_to_safe_point=float("inf"))
