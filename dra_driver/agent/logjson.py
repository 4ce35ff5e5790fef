"""Structured JSON log lines: a constant message plus Kubernetes structured-logging keys."""

from __future__ import annotations

import json
import logging
import time

_STD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in _STD:
                out[k] = v if isinstance(v, str | int | float | bool | type(None) | list | dict) else str(v)
        if record.exc_info:
            out["err"] = self.formatException(record.exc_info)
        return json.dumps(out, separators=(",", ":"))


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
