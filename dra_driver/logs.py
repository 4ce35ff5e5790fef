"""Structured JSON logs: a constant message plus Kubernetes-style structured keys (``pod``, ``err``)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_STD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(time.time(), 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in _STD and not k.startswith("_"):
                doc[k] = v if isinstance(v, str | int | float | bool | type(None)) else str(v)
        if record.exc_info:
            doc["stacktrace"] = self.formatException(record.exc_info)
        return json.dumps(doc, sort_keys=False)


def setup(level: str = "info") -> None:
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [h]
    root.setLevel(level.upper())
