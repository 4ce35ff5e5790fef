"""A stand-in ``/metrics`` endpoint for end-to-end tests that run a real Prometheus: every GET is
answered with the text a ``render`` callable returns at that moment (Prometheus text format 0.0.4).
The vLLM stand-in of the dashboard test and the trace replay of the predictor test both serve
through it.

I/O: one HTTP server on 127.0.0.1 at a free port, served from a daemon thread until ``close``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


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
