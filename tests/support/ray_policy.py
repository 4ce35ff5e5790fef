"""The Ray actor of ``tests/contract/rose_sdk/test_ray_actor.py`` (a module of its own: Ray's workers import it
by name, ``tests.support.ray_policy``, with the repository on their PYTHONPATH). A small torch model
updated by calls, registered with its pod's node agent through ``rose_sdk.integrations.ray``."""

from __future__ import annotations

import os

import torch

from rose_sdk.integrations.ray import register_actor, rose_method

SIZE = 64


def update(model: torch.nn.Linear, n: int) -> None:
    """``n`` deterministic in-place updates (the same on any CPU)."""
    with torch.no_grad():
        for _ in range(n):
            model.weight.mul_(0.5).add_(model.weight.sin())
            model.bias.add_(1.0)


def new_model() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(SIZE, SIZE)


class Policy:
    def __init__(self) -> None:
        self.model = new_model()
        self.rose = register_actor(model=self.model, idle_poll_s=0.02)

    @rose_method
    def update(self, n: int) -> int:
        update(self.model, n)
        return os.getpid()

    def status(self) -> tuple[bool, bool, int, int]:
        wl = self.rose.workload
        return wl.connected_to_agent, wl.suspended, wl.suspend_count, wl.resume_count

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.model.state_dict().items()}

    def close(self) -> None:
        self.rose.close()
