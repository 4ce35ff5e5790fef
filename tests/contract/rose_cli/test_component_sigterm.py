"""SIGTERM stops every long-running component in an orderly way, within a bound, leaving no thread.

Each component runs as the real ``python -m rose_cli <command>`` process, all six at once (the
API server they are pointed at does not answer: they start, retry their watches, and must still
stop). After its ready line, SIGTERM must end it with status 0 within ``STOP_BOUND_S``, without a
traceback and without the runner's ``threads left at exit`` line (a thread the runner started
that did not end within its join bound). A non-daemon thread left running would keep the process
alive past the bound.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

READY_BOUND_S = 180.0  # six interpreters starting together on a loaded two-core machine
STOP_BOUND_S = 15.0  # the runner's join bound (10 s) plus the servers' own grace

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def _components(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """command → (its arguments, the line it writes once it is running)."""
    kc = tmp / "kubeconfig"
    kc.write_text(KUBECONFIG)
    pools = tmp / "pools.yaml"
    pools.write_text("pools:\n- {name: p, query: 'up', unit: gpus, capacity: 8}\n")
    k = ["--kubeconfig", str(kc)]
    return {
        "extender": (["extender", *k, "--forecast-backend", "none", "--listen", "127.0.0.1:0"], "listening on"),
        "controller": (
            ["controller", *k, "--forecast-backend", "none", "--metrics-listen", "127.0.0.1:0"],
            '"controller running"',
        ),
        "driver": (
            [
                "driver",
                *k,
                "--node-name",
                "n1",
                "--gpu-backend",
                "simulated",
                "--metrics-port",
                "0",
                "--plugin-dir",
                str(tmp / "d/plugin"),
                "--registry-dir",
                str(tmp / "d/registry"),
                "--agent-socket",
                str(tmp / "d/agent/workload.sock"),
            ],
            '"driver started"',
        ),
        "agent": (
            [
                "agent",
                "--backends",
                "simulated",
                "--metrics-port",
                "0",
                "--workload-socket",
                str(tmp / "a/workload.sock"),
                "--control-socket",
                str(tmp / "a/control.sock"),
            ],
            '"agent serving"',
        ),
        "timeslice": (
            [
                "timeslice",
                "serve",
                "--store",
                "memory",
                "--authenticate",
                "none",
                "--job-check",
                "none",
                "--insecure",
                "--leader-elect",
                "false",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ],
            "timeslice: listening on",
        ),
        "predictor": (
            ["predictor", "serve", "--pools", str(pools), "--replay", "generated", "--listen", "127.0.0.1:0"],
            '"model fitted"',  # past its first fit: in its steady loop
        ),
    }


def test_sigterm_stops_every_component_within_a_bound_leaving_no_thread(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "ROSE_DEBUG")}
    procs: dict[str, tuple[subprocess.Popen[bytes], Path, str]] = {}
    try:
        for name, (args, ready) in _components(tmp_path).items():
            out = tmp_path / f"{name}.log"
            with out.open("wb") as f:
                p = subprocess.Popen(
                    [sys.executable, "-m", "rose_cli", *args], stdout=f, stderr=subprocess.STDOUT, env=env
                )
            procs[name] = (p, out, ready)
        waiting = dict(procs)
        deadline = time.monotonic() + READY_BOUND_S
        while waiting and time.monotonic() < deadline:
            for name, (p, out, ready) in list(waiting.items()):
                assert p.poll() is None, f"{name} exited before it was ready: {out.read_text()[-2000:]}"
                if ready in out.read_text():
                    del waiting[name]
            time.sleep(0.2)
        assert not waiting, f"not ready within {READY_BOUND_S}s: {sorted(waiting)}"
        took: dict[str, float] = {}
        for name, (p, out, _) in procs.items():
            started = time.monotonic()
            p.send_signal(signal.SIGTERM)
            try:
                code = p.wait(STOP_BOUND_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} still running {STOP_BOUND_S}s after SIGTERM: {out.read_text()[-2000:]}")
            took[name] = time.monotonic() - started
            text = out.read_text()
            assert code == 0, f"{name} exited {code}: {text[-2000:]}"
            assert "Traceback" not in text and "threads left at exit" not in text, f"{name}: {text[-2000:]}"
        print("seconds from SIGTERM to exit:", {k: round(v, 2) for k, v in took.items()})
    finally:
        for p, _, _ in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
