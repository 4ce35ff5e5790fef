"""The example RL workload, unchanged, with the GPU's next tenant simulated at every suspend.

    python tests/support/next_tenant_workload.py --report R.json <arguments of the example>

Runs ``examples/01_cartpole_reinforce.py`` with ``rose_sdk.Workload`` replaced by a subclass that
hooks :class:`next_tenant.NextTenant` around the offload (``on_suspend`` before it,
``on_suspended`` right after it, while the job is suspended), then writes the per-suspend
records to the JSON report: how many tensors of each kind were checked, which stayed on their
old storage. I/O: the report file; the example's own output.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]

import rose_sdk  # noqa: E402
from tests.support.next_tenant import NextTenant  # noqa: E402

EXAMPLE = HERE.parents[1] / "examples" / "01_cartpole_reinforce.py"
TENANTS: list[NextTenant] = []


class NextTenantWorkload(rose_sdk.Workload):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        tenant = NextTenant(self.model, self.optimizer, dict(kwargs.get("tensors") or {}), self.offloader.device)
        self.on_suspend(tenant.before_offload)
        self.on_suspended(tenant.while_suspended)
        TENANTS.append(tenant)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--report", required=True)
    ours, rest = p.parse_known_args()
    spec = importlib.util.spec_from_file_location("cartpole_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rose_sdk.Workload = NextTenantWorkload  # type: ignore[misc]
    rc = int(example.main(rest))
    records = [dataclasses.asdict(r) for t in TENANTS for r in t.records]
    Path(ours.report).write_text(json.dumps({"suspends": records}, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
