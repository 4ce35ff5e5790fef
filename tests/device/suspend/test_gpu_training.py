"""Training is unharmed by suspend on a real GPU: a small MLP with Adam trained ON THE GPU, suspended
and resumed several times by each backend, with the GPU memory overwritten by another allocation
while suspended, ends bit-identical to an uninterrupted run with the same seed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.train_child import build, digest, train

CYCLES = 4
STEPS = 3  # per cycle
CHILD = [sys.executable, str(Path(__file__).resolve().parents[2] / "support" / "train_child.py")]


def _overwrite_free_gpu_memory(byte: int) -> int:
    """Another tenant: fill half the free device memory (at most 16 GiB) with ``byte``, then free it."""
    import torch

    free, _ = torch.cuda.mem_get_info()
    n = min(free // 2, 16 << 30)
    junk = torch.full((n,), byte, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    del junk
    torch.cuda.empty_cache()
    return int(n)


def test_cooperative_suspend_resume_of_adam_training_is_bit_exact(cuda: str) -> None:
    import torch

    from rose_sdk.offload import CooperativeOffloader

    torch.use_deterministic_algorithms(True)
    ref_model, ref_opt = build()
    train(ref_model, ref_opt, 0, CYCLES * STEPS)
    want = digest(ref_model, ref_opt)
    del ref_model, ref_opt
    torch.cuda.empty_cache()

    model, opt = build()
    off = CooperativeOffloader(model=model, optimizer=opt)
    for c in range(CYCLES):
        train(model, opt, c * STEPS, STEPS)
        torch.cuda.synchronize()
        state = off.state_bytes()
        before = torch.cuda.memory_allocated()
        rep = off.offload()
        assert rep.bytes_moved >= state > 0
        assert before - torch.cuda.memory_allocated() >= state  # device memory freed
        for p in model.parameters():  # every parameter, gradient and Adam moment left the GPU
            assert p.device.type == "cpu" and (p.grad is None or p.grad.device.type == "cpu")
            assert all(v.device.type == "cpu" for v in opt.state[p].values() if torch.is_tensor(v) and v.dim())
        assert _overwrite_free_gpu_memory(0xA5 + c) >= state
        off.restore()
    assert digest(model, opt) == want


def test_cuda_checkpoint_suspend_resume_of_adam_training_is_bit_exact(cuda: str) -> None:
    import torch

    from benchmarks.gpu_suspend import Child
    from dra_driver.suspend.cuda_checkpoint import (
        PROCESS_STATE_CHECKPOINTED,
        PROCESS_STATE_RUNNING,
        CudaCheckpointUnavailable,
        CudaDriver,
    )
    from dra_driver.suspend.support import read_process_facts, unsupported_reasons

    try:
        drv = CudaDriver.load()
        drv.init()
    except CudaCheckpointUnavailable as e:
        pytest.skip(f"cuda-checkpoint unavailable on this machine: {e}")

    ref = Child(CHILD)
    try:
        ref.read_json(timeout=120)
        ref.send(f"step {CYCLES * STEPS}")
        ref.read_json(timeout=300)
        ref.send("digest")
        want = ref.read_json(timeout=120)["digest"]
    finally:
        ref.close()

    child = Child(CHILD)
    try:
        pid = child.read_json(timeout=120)["pid"]
        # a plain single-process torch job is not refused (torch maps libnccl; that alone is no NCCL job)
        assert unsupported_reasons(read_process_facts(pid)) == []
        for _ in range(CYCLES):
            child.send(f"step {STEPS}")
            child.read_json(timeout=300)
            free0, _ = torch.cuda.mem_get_info()
            drv.lock(pid, 60_000)
            try:
                drv.checkpoint(pid)
            except Exception:
                drv.unlock(pid)
                raise
            assert drv.get_state(pid) == PROCESS_STATE_CHECKPOINTED
            free1, _ = torch.cuda.mem_get_info()
            assert free1 > free0  # the child's device memory was released
            _overwrite_free_gpu_memory(0x5A)
            drv.restore(pid)
            drv.unlock(pid)
            assert drv.get_state(pid) == PROCESS_STATE_RUNNING
        child.send("digest")
        got = child.read_json(timeout=120)
    finally:
        child.close()
    assert got["steps"] == CYCLES * STEPS and got["digest"] == want
