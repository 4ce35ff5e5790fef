"""Peak extra host RAM of ``save_checkpoint`` / ``load_checkpoint``, measured in this process.

Run as ``python -m tests.support.sdk_checkpoint_memory MIB save|load PATH``; prints one JSON line.
Peak RSS (``VmHWM``) is reset through ``/proc/self/clear_refs`` right before the operation, so
the figure is what the operation itself added: for ``save`` everything above the resident
state, for ``load`` everything above the loaded state (``extra_mib``). Linux only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from rose_sdk import load_checkpoint, save_checkpoint


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> int:
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS")


def main(argv: list[str]) -> int:
    mib, mode, path = int(argv[0]), argv[1], Path(argv[2])
    if mode == "save":
        model = torch.nn.Module()
        model.w = torch.nn.Parameter(torch.ones(mib << 18))  # MiB of float32
        base = _reset_peak()
        save_checkpoint(path, model=model, step=1)
        extra_kib = _status_kib("VmHWM") - base
    else:
        base = _reset_peak()
        ckpt = load_checkpoint(path)
        assert ckpt.model_state is not None and ckpt.model_state["w"].numel() == mib << 18
        extra_kib = _status_kib("VmHWM") - base - (mib << 10)
    print(json.dumps({"mode": mode, "state_mib": mib, "extra_mib": round(extra_kib / 1024, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
