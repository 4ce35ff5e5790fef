"""A training process for the device tier: a small MLP with Adam on the GPU, driven over stdin.

Commands (one per line): ``step N`` trains N more steps; ``digest`` answers the sha256 of every
parameter and Adam state tensor; ``exit``. Answers are one JSON object per line. Deterministic:
the same seed gives bit-identical tensors (deterministic algorithms, fixed cuBLAS workspace).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch

WIDTH = 512


def build(seed: int = 7) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(), torch.nn.Linear(4 * WIDTH, WIDTH)
    ).to("cuda")
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, start: int, steps: int) -> None:
    for s in range(start, start + steps):
        g = torch.Generator(device="cuda")
        g.manual_seed(1000 + s)
        x = torch.randn(64, WIDTH, device="cuda", generator=g)
        loss = (model(x) - x.flip(1)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def digest(model: torch.nn.Module, opt: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
        for k, v in sorted(opt.state[p].items()):
            h.update(k.encode())
            h.update(v.detach().cpu().numpy().tobytes() if torch.is_tensor(v) else repr(v).encode())
    return h.hexdigest()


def main() -> int:
    torch.use_deterministic_algorithms(True)
    model, opt = build()
    done = 0
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd and cmd[0] == "step":
            train(model, opt, done, int(cmd[1]))
            done += int(cmd[1])
            torch.cuda.synchronize()
            print(json.dumps({"steps": done}), flush=True)
        elif cmd == ["digest"]:
            print(json.dumps({"digest": digest(model, opt), "steps": done}), flush=True)
        elif cmd == ["exit"]:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
