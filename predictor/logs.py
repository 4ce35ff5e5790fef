"""Structured JSON logs: a constant message plus Kubernetes-style structured keys."""

from __future__ import annotations

import logging
import time
from typing import Any

from rose_common import logs as shared_logs

_LOGGER = logging.getLogger("rose.predictor")


def setup(level: str = "info") -> None:
    """The predictor logs under ``rose``, as JSON lines (rose_common.logs)."""
    shared_logs.setup(level, "rose")


def log(level: int, msg: str, **kv: Any) -> None:
    """``log(logging.INFO, "model fitted", pool="a", seconds=1.2)``: the message stays constant."""
    _LOGGER.log(level, msg, extra={"kv": kv})


def info(msg: str, **kv: Any) -> None:
    log(logging.INFO, msg, **kv)


def warning(msg: str, **kv: Any) -> None:
    log(logging.WARNING, msg, **kv)


def error(msg: str, **kv: Any) -> None:
    log(logging.ERROR, msg, **kv)


def monotonic() -> float:
    return time.monotonic()
