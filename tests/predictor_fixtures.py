"""Shared helpers for the predictor's tests (imported by tests/*/test_predictor_*.py)."""

from __future__ import annotations

import os
from pathlib import Path

from predictor.model import ModelConfig

REPO = Path(__file__).resolve().parent.parent


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
