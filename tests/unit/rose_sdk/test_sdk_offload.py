"""Cooperative offload on the CPU: data really moves to separate host buffers and back, bit-exact.

The resume tests overwrite the memory the job's tensors used while it is suspended (the GPU's next
tenant, ``tests/support/next_tenant.py``) and check that every tensor left that memory: on a CPU a no-op
offload would otherwise look bit-exact."""

from __future__ import annotations

import copy

import pytest
import torch

from rose_sdk import CooperativeOffloader, tensors_equal
from tests.support.next_tenant import NextTenant

# trained()'s tensors: 6 parameters, 6 gradients, BatchNorm's 3 buffers, Adam's step / exp_avg /
# exp_avg_sq of each parameter, one registered tensor
JOB_TENSORS = {"param": 6, "grad": 6, "buffer": 3, "optim": 18, "tensor": 1}


def trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    for _ in range(3):
        loss = m(torch.randn(4, 8)).square().sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m, opt


def train_step(m: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator) -> None:
    loss = m(torch.randn(4, 8, generator=gen)).square().sum()
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_resume_after_the_next_tenant_overwrote_the_memory_is_bit_exact() -> None:
    """Suspend, overwrite the memory every tensor used with NaN bytes, resume, train on: the run
    ends bit-identical to an uninterrupted twin, and every tensor had left its memory."""
    m, opt = trained()
    twin_m, twin_opt = trained()
    extra, twin_extra = torch.arange(10.0), torch.arange(10.0)
    gen, twin_gen = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    off = CooperativeOffloader(m, opt, {"extra": extra}, device="cpu")
    tenant = NextTenant(m, opt, {"extra": extra}, off.device)
    for _ in range(3):
        tenant.before_offload()
        off.offload()
        tenant.while_suspended()
        off.restore()
        train_step(m, opt, gen)
        train_step(twin_m, twin_opt, twin_gen)
        with torch.no_grad():
            extra.mul_(2)
            twin_extra.mul_(2)
    assert [r.checked for r in tenant.records] == [JOB_TENSORS] * 3
    assert [r.stayed for r in tenant.records] == [[]] * 3
    assert tensors_equal(m.state_dict(), twin_m.state_dict())
    assert tensors_equal(opt.state_dict(), twin_opt.state_dict())
    assert torch.equal(extra, twin_extra)
    for p, q in zip(m.parameters(), twin_m.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None and torch.equal(p.grad, q.grad)


def in_arena(t: torch.Tensor, off: CooperativeOffloader) -> bool:
    base = off.arena_data_ptr()
    return base <= t.data_ptr() < base + off.host_buffer_bytes


def test_offload_restore_bit_exact_and_arena_reused() -> None:
    m, opt = trained()
    extra = torch.arange(10, dtype=torch.int64)
    want_model, want_opt = copy.deepcopy(m.state_dict()), copy.deepcopy(opt.state_dict())
    off = CooperativeOffloader(m, opt, {"extra": extra}, device="cpu")
    assert off.pin_memory is False  # no CUDA here: plain host buffers
    params = list(m.parameters())
    moments = opt.state[params[0]]["exp_avg"]
    expect_bytes = sum(t.numel() * t.element_size() for t in off.device_tensors())
    rep = off.offload()
    # 6 params, 6 grads, 3 BN buffers, Adam state (step, exp_avg, exp_avg_sq) x 6, the registered tensor
    assert rep.tensors == 6 + 6 + 3 + 6 * 3 + 1
    assert rep.bytes_moved == expect_bytes
    assert not rep.arena_reused
    assert all(in_arena(t, off) for t in [*params, moments, extra])  # same objects, now in the arena
    assert tensors_equal(m.state_dict(), want_model) and tensors_equal(opt.state_dict(), want_opt)
    back = off.restore()
    assert back.bytes_moved == rep.bytes_moved
    assert not any(in_arena(t, off) for t in [*params, moments, extra])  # fresh "device" storage
    assert tensors_equal(m.state_dict(), want_model) and tensors_equal(opt.state_dict(), want_opt)
    ptr = off.arena_data_ptr()
    again = off.offload()
    assert again.arena_reused and off.arena_data_ptr() == ptr
    off.restore()
    # training continues through the same references
    loss = m(torch.randn(4, 8)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert not tensors_equal(m.state_dict(), want_model)


def test_offload_is_idempotent_and_guards_misuse() -> None:
    m, opt = trained()
    off = CooperativeOffloader(m, opt, device="cpu")
    assert off.restore().bytes_moved == 0
    assert off.offload().bytes_moved > 0 and off.offload().bytes_moved == 0
    with pytest.raises(RuntimeError, match="restore"):
        off.release_host_buffers()
    with pytest.raises(RuntimeError, match="while offloaded"):
        off.register("x", torch.zeros(1))
    off.restore()
    off.release_host_buffers()
    assert off.host_buffer_bytes == 0


def test_pinning_without_cuda_is_refused() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="needs CUDA"):
        CooperativeOffloader(torch.nn.Linear(1, 1), pin_memory=True)


def test_layout_change_reallocates_the_arena() -> None:
    m = torch.nn.Linear(4, 4)
    off = CooperativeOffloader(m, device="cpu")
    off.offload()
    off.restore()
    off.register("late", torch.ones(1000))
    rep = off.offload()
    assert not rep.arena_reused and rep.bytes_moved == (16 + 4 + 1000) * 4
    off.restore()


def test_device_defaults_to_where_the_model_lives() -> None:
    assert CooperativeOffloader(torch.nn.Linear(2, 2)).device == torch.device("cpu")
    assert CooperativeOffloader(tensors={"x": torch.zeros(2)}).device == torch.device("cpu")
