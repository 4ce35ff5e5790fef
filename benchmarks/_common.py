"""Small helpers the benchmark scripts share: a timestamped progress line, p-quantiles of a
cumulative Prometheus histogram in milliseconds, and the JSON report a ``--json`` flag asks for.

I/O boundary: ``log`` writes to stderr, ``emit_json`` to stdout, ``write_json`` the given file;
``quantiles_ms`` is pure.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rose_common import promtext


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def quantiles_ms(
    cumulative: list[tuple[float, float]], qs: Sequence[float] = (0.5, 0.95), digits: int = 1
) -> dict[str, float]:
    """``count`` and ``p<q>_ms`` for each of ``qs`` (linear inside a bucket, as PromQL does)."""
    total = cumulative[-1][1] if cumulative else 0.0
    out: dict[str, float] = {"count": total}
    if total > 0:
        for q in qs:
            out[f"p{int(q * 100)}_ms"] = round(promtext.histogram_quantile(q, cumulative) * 1000, digits)
    return out


def write_json(path: Path | None, report: object, indent: int = 1) -> None:
    """The report as indented JSON at ``path`` (nothing when no path was asked for)."""
    if path is not None:
        path.write_text(json.dumps(report, indent=indent) + "\n")


def emit_json(report: object, path: Path | None, indent: int = 1) -> None:
    """The report as indented JSON on stdout, and at ``path`` when one was asked for."""
    print(json.dumps(report, indent=indent))
    write_json(path, report, indent)
