"""A real small CPU RL training (REINFORCE on CartPole: the example's environment and episode) that holds a
time-slice group for each update phase through ``rose_sdk.timeslice``; used by the acceptance test.

    python tests/support/timeslice_trainer.py --out run.pt --updates 12 [--target HOST:PORT --job NAME --group G]

Without ``--target`` it runs solo. With it, each update (the accelerator phase) runs inside
``on_accelerators``; the client offloads the policy, Adam state and a registered tensor to host
memory at each yield. ``--clobber`` plays the next job: right after each yield it overwrites the
storage those tensors had on the device, so a yield that left state on the device corrupts the run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rose_sdk import CooperativeOffloader  # noqa: E402
from rose_sdk.timeslice import TimeSliceOrchestratorClient  # noqa: E402


def _example() -> Any:
    """examples/01_cartpole_reinforce.py as a module: its CartPole and its ``episode`` (one
    REINFORCE rollout and its loss) are this trainer's environment and rollout."""
    spec = importlib.util.spec_from_file_location("cartpole_example", ROOT / "examples" / "01_cartpole_reinforce.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Clobbering(TimeSliceOrchestratorClient):
    """The client, plus the next job's writes into this job's device storage after every yield."""

    def release(self, group: str | None = None) -> None:
        assert self.offloader is not None
        storages = [t.untyped_storage() for t in self.offloader.device_tensors()]
        super().release(group)
        for s in storages:  # the memory the next job now owns on the device
            s.fill_(0x3C)  # every float32 becomes 0.0115: wrong, yet finite


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--updates", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", default="")
    ap.add_argument("--job", default="")
    ap.add_argument("--group", default="g")
    ap.add_argument("--clobber", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    example = _example()
    env = example.CartPole(np.random.default_rng(args.seed))
    policy = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    replay = torch.zeros(64, 4)
    client: TimeSliceOrchestratorClient | None = None
    if args.target:
        off = CooperativeOffloader(policy, opt, {"replay": replay})
        cls = Clobbering if args.clobber else TimeSliceOrchestratorClient
        client = cls(args.target, args.job, role="trainer", offloader=off, min_phase_ratio=0)
    for update in range(args.updates):
        phase = client.on_accelerators(group_id=args.group, timeout_s=120) if client else contextlib.nullcontext()
        with phase:
            loss, obs, _ = example.episode(policy, env)
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                replay[update % 64] = torch.from_numpy(obs)
    switched = sum(not g.was_resident for g in client.grants) if client else 0
    torch.save(
        {
            "policy": policy.state_dict(),
            "opt": opt.state_dict(),
            "replay": replay,
            "torch_rng": torch.get_rng_state(),
            "env_rng": str(env.rng.bit_generator.state),
            "switched": switched,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
