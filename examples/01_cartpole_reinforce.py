"""Example 01: an RL job that ROSE can suspend into host memory and resume bit-exact.

REINFORCE on CartPole (the classic-control dynamics written here in NumPy: no gym download) with
a small torch policy on the CPU. It calls ``rose_sdk`` safe points after every update, so the
node agent can suspend it (cooperative offload of the model, Adam state and a registered
tensor) and resume it where it stopped. Without ROSE_AGENT_SOCKET it runs uninterrupted.

Elastic: with ``--global-episodes G`` the job collects G episodes per update across its active
workers; when the job shrinks or grows, the node agent delivers the new world at a safe point
(``on_world_change``) and this worker collects its share, ``world.share(G)`` episodes, from the
next update on. ``--world-points U1,U2`` makes the k-th world change land exactly at update Uk
(the worker waits there for it), so a schedule of changes gives a deterministic run. It reports
its phase, seconds to the next safe point and steps / samples through the agent (``report``).

    python examples/01_cartpole_reinforce.py --updates 60 --out /tmp/run.pt

The end-to-end tests and ``rose demo`` run this very file as the RL pod's process.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout


class CartPole:
    """CartPole-v1 dynamics (Barto, Sutton & Anderson 1983; gym's constants), explicit Euler."""

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    theta_threshold = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    def __init__(self, rng: np.random.Generator, max_steps: int = 200) -> None:
        self.rng = rng
        self.max_steps = max_steps
        self.state = np.zeros(4)
        self.t = 0

    def reset(self) -> np.ndarray:
        self.state = self.rng.uniform(-0.05, 0.05, size=4)
        self.t = 0
        return self.state.astype(np.float32)

    def step(self, action: int) -> tuple[np.ndarray, float, bool]:
        x, x_dot, theta, theta_dot = self.state
        force = self.force_mag if action == 1 else -self.force_mag
        total_mass = self.masspole + self.masscart
        pml = self.masspole * self.length
        cos, sin = math.cos(theta), math.sin(theta)
        temp = (force + pml * theta_dot**2 * sin) / total_mass
        theta_acc = (self.gravity * sin - cos * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * cos**2 / total_mass)
        )
        x_acc = temp - pml * theta_acc * cos / total_mass
        x, x_dot = x + self.tau * x_dot, x_dot + self.tau * x_acc
        theta, theta_dot = theta + self.tau * theta_dot, theta_dot + self.tau * theta_acc
        self.state = np.array([x, x_dot, theta, theta_dot])
        self.t += 1
        done = abs(x) > self.x_threshold or abs(theta) > self.theta_threshold or self.t >= self.max_steps
        return self.state.astype(np.float32), 1.0, bool(done)


def episode(policy: Any, env: CartPole) -> tuple[Any, np.ndarray, int]:
    """One episode: its REINFORCE loss (normalised returns), the last observation, its length."""
    import torch

    obs = env.reset()
    logps, rewards = [], []
    done = False
    while not done:
        logits = policy(torch.from_numpy(obs))
        dist = torch.distributions.Categorical(logits=logits)
        a = dist.sample()
        logps.append(dist.log_prob(a))
        obs, r, done = env.step(int(a.item()))
        rewards.append(r)
    returns, g = [], 0.0
    for r in reversed(rewards):
        g = r + 0.99 * g
        returns.append(g)
    ret = torch.tensor(list(reversed(returns)))
    ret = (ret - ret.mean()) / (ret.std() + 1e-8)
    return -(torch.stack(logps) * ret).sum(), obs, len(rewards)


def train(args: argparse.Namespace) -> None:
    import torch

    import rose_sdk

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    env = CartPole(rng)
    policy = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    replay = torch.zeros(256, 4)  # a registered tensor the offload must carry too
    wl = rose_sdk.Workload(
        model=policy,
        optimizer=opt,
        tensors={"replay": replay},
        checkpoint_path=args.checkpoint,
        user_state=lambda: {"env_rng": env.rng.bit_generator.state, "lengths": list(lengths), "replay": replay},
    )
    lengths: list[int] = []
    hooks = {"suspend": 0, "resume": 0, "offloaded_at_resume_hook": 0}
    episodes = [1]  # this worker's episodes per update (its share of --global-episodes)
    worlds: list[tuple[int, int, int]] = []  # (update, active, total) of each change

    @wl.on_world_change
    def adapt(world: rose_sdk.World) -> None:
        if args.global_episodes:
            episodes[0] = world.share(args.global_episodes)
        worlds.append((len(per_update), world.active, world.total))
        print(f"WORLD {world} update={len(per_update)} episodes={episodes[0]}", flush=True)

    @wl.on_suspend
    def before_offload() -> None:
        hooks["suspend"] += 1

    @wl.on_resume
    def after_restore() -> None:
        hooks["resume"] += 1
        hooks["offloaded_at_resume_hook"] += int(wl.offloader.offloaded)

    wl.start()
    if wl.restored is not None:  # ROSE_RESTORE=latest: a recreated worker continues from its checkpoint
        u = wl.restored.user_state
        env.rng.bit_generator.state, lengths[:] = u["env_rng"], u["lengths"]
        replay.copy_(u["replay"])
    print(f"READY {os.getpid()} step={wl.step}", flush=True)
    stall_until = time.monotonic() + args.stall_seconds
    world_points = [int(u) for u in args.world_points.split(",") if u] if args.world_points else []
    per_update: list[float] = []  # mean episode length of each update
    samples = 0
    wait_points = set()
    if args.suspend_points:
        every = max(1, args.updates // (args.suspend_points + 1))
        wait_points = {every * (k + 1) for k in range(args.suspend_points)}
    for update in range(wl.step, args.updates):  # wl.step > 0: restored from a checkpoint
        t0 = time.monotonic()
        losses, obs, steps = [], None, []
        for _ in range(episodes[0]):
            loss, obs, n = episode(policy, env)
            losses.append(loss)
            steps.append(n)
        loss = torch.stack(losses).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            replay[update % 256] = torch.from_numpy(obs)
        lengths.append(steps[-1])
        per_update.append(sum(steps) / len(steps))
        samples += sum(steps)
        wl.report("train", seconds_to_safe_point=time.monotonic() - t0, steps=update + 1, samples=samples)
        if update + 1 in world_points:
            k = world_points.index(update + 1) + 1
            print(f"AWAIT_WORLD {k}", flush=True)
            deadline = time.monotonic() + 60
            while len(worlds) < k and time.monotonic() < deadline:
                wl.safe_point(update + 1, wait_seconds=0.2)
            continue
        if time.monotonic() < stall_until:
            continue  # a long stretch with no safe point: the agent's deadline must fire
        if update + 1 in wait_points:
            k = sorted(wait_points).index(update + 1) + 1
            deadline = time.monotonic() + args.suspend_wait_seconds
            while wl.suspend_count < k and time.monotonic() < deadline:
                wl.safe_point(update + 1, wait_seconds=0.5)
        else:
            wl.safe_point(update + 1)
    if args.linger_seconds or args.linger_until:
        # after the updates, stay registered at safe points (it can still be suspended and resumed):
        # --linger-seconds from now, or until the wall-clock time --linger-until, whichever is later
        end = time.monotonic() + max(args.linger_seconds, args.linger_until - time.time())
        while time.monotonic() < end:
            wl.safe_point(args.updates, wait_seconds=0.1)
    torch.save(
        {
            "model": policy.state_dict(),
            "optimizer": opt.state_dict(),
            "replay": replay,
            "lengths": lengths,
            "suspends": wl.suspend_count,
            "resumes": wl.resume_count,
            "rng": torch.get_rng_state(),
            "hooks": hooks,
            "per_update": per_update,
            "worlds": worlds,
        },
        args.out,
    )
    wl.close()
    print(f"DONE suspends={wl.suspend_count} resumes={wl.resume_count} last_len={lengths[-1]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--updates", type=int, default=60)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--suspend-points", type=int, default=0)
    p.add_argument("--suspend-wait-seconds", type=float, default=60.0, help="how long each suspend point waits")
    p.add_argument("--stall-seconds", type=float, default=0.0)
    p.add_argument("--linger-seconds", type=float, default=0.0)
    p.add_argument("--linger-until", type=float, default=0.0, help="linger until this Unix time (seconds)")
    p.add_argument("--global-episodes", type=int, default=0, help="episodes per update across the active workers")
    p.add_argument("--world-points", default="", help="updates U1,U2,... where the k-th world change must land")
    train(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
