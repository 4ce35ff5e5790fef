"""Prometheus for end-to-end tests: a real Prometheus process (Debian's ``prometheus`` package)
and stand-in ``/metrics`` endpoints for it to scrape, each answering with the text a ``render``
callable returns at that moment (Prometheus text format 0.0.4). The dashboard test's vLLM
stand-in and the predictor test's trace replay both serve through :class:`MetricsStandIn`.

I/O: ``prometheus`` runs the binary on a free loopback port with its config, TSDB and log under a
test's directory; ``MetricsStandIn`` is an HTTP server on 127.0.0.1 at a free port, served from a
daemon thread until ``close``.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from local_cluster import free_port, stop_process

PROMETHEUS = "/usr/bin/prometheus"


@dataclass(frozen=True)
class Prometheus:
    proc: subprocess.Popen[bytes]
    url: str


@contextlib.contextmanager
def prometheus(config: str, tmp: Path, tsdb: Path | None = None, extra: Sequence[str] = ()) -> Iterator[Prometheus]:
    """Prometheus with ``config`` (YAML) as ``tmp``/prometheus.yml, its TSDB at ``tsdb`` (default
    ``tmp``/tsdb), its output in ``tmp``/prometheus.log and ``extra`` flags; stopped at the end."""
    assert Path(PROMETHEUS).exists(), "Debian's prometheus package is required: apt-get install -y prometheus"
    (tmp / "prometheus.yml").write_text(config)
    port = free_port()
    argv = [
        PROMETHEUS,
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tsdb or tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        *extra,
    ]
    with (tmp / "prometheus.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield Prometheus(proc, f"http://127.0.0.1:{port}")
        finally:
            stop_process(proc, timeout=30)


class MetricsStandIn:
    """Serves ``render()`` on every GET; ``port`` is where Prometheus scrapes it."""

    def __init__(self, render: Callable[[], str]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> MetricsStandIn:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
