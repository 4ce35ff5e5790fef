"""A cooperative rose_sdk workload with a sizeable host copy, for the cooperative-spill tests.

    python tests/support/spill_coop_workload.py --state-mib 64 [--lie keep|garbage|stall] [--resumes 1]

A small model + Adam and one registered tensor of ``--state-mib`` MiB (seeded random floats), on
the CPU. It trains a step and reaches a safe point in a loop until it has been resumed
``--resumes`` times, then exits 0. :class:`next_tenant.NextTenant` overwrites the memory its
tensors used while it is suspended (the GPU's next tenant). At every suspend it prints the
blake2b digest of all its tensors (``DIGEST-SUSPEND <hex>``), after every resume the digest again
(``DIGEST-RESUME <hex>``), so the test compares them: bit-exact or not.

``--lie`` makes it misbehave towards the driver (the tests check the driver catches it):
``keep`` acknowledges the spill commit but keeps its host copy; ``garbage`` writes random bytes
instead of its state to the spill file and acknowledges; ``stall`` writes the first chunk, prints
``SPILLING`` and hangs (the test SIGKILLs it mid-spill). I/O: stdout, the spill file.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]

import torch  # noqa: E402

import rose_sdk  # noqa: E402
from rose_common import spillfmt  # noqa: E402
from rose_sdk.offload import CooperativeOffloader  # noqa: E402
from tests.support.next_tenant import NextTenant, job_tensors  # noqa: E402


class LyingOffloader(CooperativeOffloader):
    lie = ""

    def spill_to(self, path: str, chunk_bytes: int = spillfmt.DEFAULT_CHUNK_BYTES) -> int:
        if self.lie == "garbage":
            n = self.state_bytes()
            with open(path, "r+b") as f:
                f.write(os.urandom(n))
                f.flush()
                os.fsync(f.fileno())
            return n
        if self.lie == "stall":
            with open(path, "r+b") as f:
                f.write(b"ROSESPL1" + os.urandom(1 << 20))
                f.flush()
            print("SPILLING", flush=True)
            time.sleep(3600)
        return super().spill_to(path, chunk_bytes)

    def drop_host_copy(self) -> int:
        if self.lie == "keep":
            return self.host_buffer_bytes  # says it freed them; keeps them
        return super().drop_host_copy()


def digest(model: torch.nn.Module, opt: torch.optim.Optimizer, named: dict[str, torch.Tensor]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for name, t in job_tensors(model, opt, named, torch.device("cpu")):
        h.update(name.encode())
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--state-mib", type=int, default=64)
    p.add_argument("--lie", choices=("", "keep", "garbage", "stall"), default="")
    p.add_argument("--resumes", type=int, default=1)
    p.add_argument("--out", default="")  # agent_fixtures.start_workload passes one; unused
    a = p.parse_args()
    torch.manual_seed(7)
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(11)
    named = {"replay": torch.rand(a.state_mib << 18, generator=g)}  # float32: MiB * 2^18 values
    off = LyingOffloader(model, opt, named)
    off.lie = a.lie
    wl = rose_sdk.Workload(model=model, optimizer=opt, tensors=named, offloader=off)
    tenant = NextTenant(model, opt, named, torch.device("cpu"))
    wl.on_suspend(lambda: print("DIGEST-SUSPEND", digest(model, opt, named), flush=True))
    wl.on_suspend(tenant.before_offload)
    wl.on_suspended(tenant.while_suspended)
    wl.on_resume(lambda: print("DIGEST-RESUME", digest(model, opt, named), flush=True))
    x = torch.randn(8, 32, generator=g)
    with wl:
        print("READY", os.getpid(), flush=True)
        step = 0
        while wl.resume_count < a.resumes:
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            step += 1
            wl.safe_point(step, wait_seconds=0.05)
    print("DONE", step, wl.spill_count, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
