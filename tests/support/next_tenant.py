"""The GPU's next tenant, simulated: overwrite the memory a suspended job's tensors used.

On a CPU nothing has to move for a resume to look bit-exact: a no-op offload, or a tensor the
offload forgets, keeps its data in place and training goes on unharmed. On a GPU the next tenant
(the serving pod that took the GPU back) writes over that memory. :class:`NextTenant` makes the
CPU honest:

- :meth:`NextTenant.before_offload` keeps a handle to the storage of every tensor of the job,
  enumerated here, independently of the offloader: each parameter, its gradient, each module
  buffer, every tensor of the optimizer state, every registered tensor (on ``device``);
- :meth:`NextTenant.while_suspended` records every tensor still on its old storage (it did not
  leave it: the suspend would have handed live memory to the next tenant), then fills every old
  storage with 0xFF bytes (NaN in floating point) and drops the handles.

Used by the SDK unit tests in-process and, through :mod:`next_tenant_workload`, by the contract
test that runs the example RL workload against the real agent. Test support only: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch

GARBAGE = 0xFF  # every byte: NaN for float32/float64/bfloat16, -1 for integers


def job_tensors(
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    named: Mapping[str, torch.Tensor],
    device: torch.device,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor the job owns on ``device``, named by kind (``param:``, ``grad:``, ``buffer:``,
    ``optim:``, ``tensor:``)."""
    names: dict[int, str] = {}
    if model is not None:
        for n, p in model.named_parameters():
            names[id(p)] = n
            yield f"param:{n}", p
            if p.grad is not None:
                yield f"grad:{n}", p.grad
        for n, b in model.named_buffers():
            yield f"buffer:{n}", b
    if optimizer is not None:
        for i, (p, state) in enumerate(optimizer.state.items()):
            for key, v in state.items():
                if isinstance(v, torch.Tensor):
                    yield f"optim:{names.get(id(p), i)}:{key}", v
    for n, t in named.items():
        yield f"tensor:{n}", t


def _on(t: torch.Tensor, device: torch.device) -> bool:
    return t.device.type == device.type and (device.index is None or t.device.index == device.index)


@dataclass
class SuspendRecord:
    checked: dict[str, int] = field(default_factory=dict)  # kind → tensors checked
    stayed: list[str] = field(default_factory=list)  # tensors still on their old storage


@dataclass
class NextTenant:
    model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer | None
    named: Mapping[str, torch.Tensor]
    device: torch.device
    records: list[SuspendRecord] = field(default_factory=list)
    _held: list[tuple[str, torch.Tensor, torch.UntypedStorage]] = field(default_factory=list)

    def before_offload(self) -> None:
        self._held = [
            (n, t, t.untyped_storage())
            for n, t in job_tensors(self.model, self.optimizer, self.named, self.device)
            if t.numel() > 0 and _on(t, self.device)
        ]

    def while_suspended(self) -> None:
        rec = SuspendRecord()
        for name, t, old in self._held:
            kind = name.split(":", 1)[0]
            rec.checked[kind] = rec.checked.get(kind, 0) + 1
            if t.untyped_storage().data_ptr() == old.data_ptr():
                rec.stayed.append(name)
        for _, _, old in self._held:
            torch.empty(0, dtype=torch.uint8, device=old.device).set_(old).fill_(GARBAGE)
        self._held = []
        self.records.append(rec)
