"""Shared helpers for the predictor's tests (imported by tests/*/test_predictor_*.py)."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path

from predictor.model import ModelConfig

REPO = Path(__file__).resolve().parents[2]


def traces_dir() -> Path:
    """ROSE_TRACES_DIR, default ../shared/data/traces; a missing folder fails the test (never skips)."""
    d = Path(os.environ.get("ROSE_TRACES_DIR", REPO.parent / "shared" / "data" / "traces"))
    assert d.is_dir(), f"traces folder {d} is missing: set ROSE_TRACES_DIR to the real traces"
    return d


def small_config(**kw: object) -> ModelConfig:
    """A cheap model for unit and contract tests (few trees, one horizon, one quantile)."""
    base: dict[str, object] = {
        "horizons": (1800,),
        "quantiles": (0.9,),
        "max_iter": 15,
        "min_train_rows": 48,
    }
    base.update(kw)
    return ModelConfig(**base)  # type: ignore[arg-type]


def wait_predictor_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120.0) -> None:
    """Until ``url``/readyz answers 200; fails with the log's tail if the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"predictor not ready: {log.read_text()[-2000:]}")
        time.sleep(0.5)
