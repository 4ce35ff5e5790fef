"""Structured JSON logs: a constant message plus Kubernetes-style structured keys."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_LOGGER = logging.getLogger("rose.predictor")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        kv = getattr(record, "kv", None)
        if isinstance(kv, dict):
            entry.update(kv)
        if record.exc_info and "err" not in entry:
            entry["err"] = repr(record.exc_info[1])
        return json.dumps(entry, default=str)


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("rose")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def log(level: int, msg: str, **kv: Any) -> None:
    """``log(logging.INFO, "Model fitted", pool="a", seconds=1.2)``: the message stays constant."""
    _LOGGER.log(level, msg, extra={"kv": kv})


def info(msg: str, **kv: Any) -> None:
    log(logging.INFO, msg, **kv)


def warning(msg: str, **kv: Any) -> None:
    log(logging.WARNING, msg, **kv)


def error(msg: str, **kv: Any) -> None:
    log(logging.ERROR, msg, **kv)


def monotonic() -> float:
    return time.monotonic()
