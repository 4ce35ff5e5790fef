"""Structured JSON logs for every component: a constant message plus Kubernetes structured-logging
keys (``pod="ns/name"``, ``err=...``), one JSON object per line on stderr.

The one convention (checked by ``tests/unit/rose_common/test_common_logs.py``): the message is a constant
string literal in lower case (what happened, never formatted); everything that varies goes in
lowerCamelCase keys; an error is ``err``, a pod ``pod="ns/name"``.

    log.info("claim prepared", extra={"pod": "ns/name", "claim": uid})
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_STD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
_PLAIN = (str, int, float, bool, type(None), list, dict)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key == "kv" and isinstance(value, dict):  # keys passed as one mapping
                out.update(value)
            elif key not in _STD and not key.startswith("_"):
                out[key] = value if isinstance(value, _PLAIN) else str(value)
        if record.exc_info and "err" not in out:
            out["err"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup(level: str = "info", logger: str = "") -> None:
    """Send ``logger`` (the root logger by default) to stderr as JSON lines at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    target = logging.getLogger(logger)
    target.handlers[:] = [handler]
    target.setLevel(level.upper())
    if logger:
        target.propagate = False
