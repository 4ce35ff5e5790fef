"""Every `rose ...` failure listed in issue 12 is one line on stderr and a non-zero exit (no traceback).

Each case runs the real `python -m rose_cli` in a child process, so the exit status and stderr are
exactly what a user sees.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from rose_cli.errors import describe, run_command

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""


def rose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    clean.pop("ROSE_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "rose_cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **(env or {})},
        check=False,
    )


def error_line(r: subprocess.CompletedProcess[str]) -> str:
    """The one error line: no traceback, and nothing after it."""
    assert r.returncode != 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return r.stderr.strip().splitlines()[-1]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def kubeconfig(tmp_path: Path, server: str = "http://127.0.0.1:1") -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.format(server=server))
    return str(path)


def test_extender_missing_kubeconfig_file() -> None:
    line = error_line(rose("extender", "--forecast-backend", "none", "--kubeconfig", "/nonexistent/kubeconfig"))
    assert line.startswith("rose extender: --kubeconfig /nonexistent/kubeconfig: no such file")


def test_extender_malformed_kubeconfig(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [\n")
    line = error_line(rose("extender", "--forecast-backend", "none", "--kubeconfig", str(bad)))
    assert line.startswith(f"rose extender: cannot load --kubeconfig {bad}:") and "valid kubeconfig" in line


def test_extender_without_kubeconfig_outside_a_pod() -> None:
    line = error_line(rose("extender", "--forecast-backend", "none"))
    assert line.startswith("rose extender: cannot load the in-cluster service account:") and "--kubeconfig" in line


def test_extender_port_in_use(tmp_path: Path, busy_port: int) -> None:
    args = ["extender", "--forecast-backend", "none", "--kubeconfig", kubeconfig(tmp_path)]
    line = error_line(rose(*args, "--listen", f"127.0.0.1:{busy_port}"))
    assert line == "rose extender: cannot listen on --listen: Address already in use; choose a free port"
    line = error_line(rose(*args, "--listen", "127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{busy_port}"))
    assert line.startswith("rose extender: cannot listen on --metrics-listen: Address already in use")


def test_extender_static_forecast_file_missing_is_refused_at_start(tmp_path: Path) -> None:
    args = ["extender", "--kubeconfig", kubeconfig(tmp_path), "--listen", "127.0.0.1:0"]
    line = error_line(rose(*args, "--forecast-backend", "static-file", "--forecast-file", "/nonexistent.json"))
    assert line.startswith("rose extender: --forecast-file: forecast file /nonexistent.json:")
    garbage = tmp_path / "f.json"
    garbage.write_text('{"forecasts": [{"pool": 1}]}')
    line = error_line(rose(*args, "--forecast-backend", "static-file", "--forecast-file", str(garbage)))
    assert line.startswith(f"rose extender: --forecast-file: forecast file {garbage}: expected a JSON list")


def test_controller_static_forecast_file_missing_is_refused_at_start(tmp_path: Path) -> None:
    args = ["controller", "--kubeconfig", kubeconfig(tmp_path), "--metrics-listen", "127.0.0.1:0"]
    line = error_line(rose(*args, "--forecast-backend", "static-file", "--forecast-file", "/nonexistent.json"))
    assert line.startswith("rose controller: --forecast-file: forecast file /nonexistent.json:")


def test_predictor_serve_port_in_use(tmp_path: Path, busy_port: int) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n- {name: p, query: 'up', unit: gpus, capacity: 8}\n")
    r = rose("predictor", "serve", "--pools", str(pools), "--replay", "generated", "--listen", f"127.0.0.1:{busy_port}")
    assert error_line(r).startswith(f"error: cannot listen on --listen 127.0.0.1:{busy_port}: Address already in use")


def test_driver_relative_plugin_dir() -> None:
    r = rose("driver", "--node-name", "n1", "--gpu-backend", "simulated", "--plugin-dir", "rel/dir")
    assert error_line(r) == (
        "rose driver: error: argument --plugin-dir: 'rel/dir' is a relative path: give an absolute one (e.g. /rel/dir)"
    )


def test_cluster_status_nothing_running(tmp_path: Path) -> None:
    r = rose("cluster", "--dir", str(tmp_path), "status")
    assert r.returncode == 3 and "Traceback" not in r.stderr
    assert r.stderr.strip() == "rose cluster: nothing is running: start it with `rose cluster up`"
    r = rose("cluster", "--dir", str(tmp_path), "status", "-o", "json")
    assert r.returncode == 3
    rows = json.loads(r.stdout)
    assert rows and not any(row["alive"] for row in rows) and {"component", "pid", "port", "log"} <= set(rows[0])


@pytest.mark.slow
def test_backtest_reports_progress_on_stderr(tmp_path: Path) -> None:
    series = tmp_path / "s.csv"
    assert rose("predictor", "generate", "--days", "8", "--step", "3600", "--out", str(series)).returncode == 0
    r = rose(
        "predictor", "backtest", "--series", str(series), "--horizons", "1h",
        "--json", str(tmp_path / "o.json"), "--refit-every", "2d",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    fits = [line for line in r.stderr.splitlines() if line.startswith("backtest: fit ")]
    done, total = fits[-1].removeprefix("backtest: fit ").split("/")
    assert len(fits) >= 2 and fits[0].startswith("backtest: fit 1/") and done == total
    assert "backtest: fit" not in r.stdout


class _VersionHandler(BaseHTTPRequestHandler):
    """A stand-in API server that answers only GET /version (named: no cluster runs in the unit tier)."""

    def do_GET(self) -> None:
        body = json.dumps({"gitVersion": "v1.37.1", "platform": "linux/amd64"}).encode()
        self.send_response(200 if self.path == "/version" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_version_client_and_server(tmp_path: Path) -> None:
    r = rose("version")
    assert r.returncode == 0 and r.stdout.startswith("Client Version: rose ") and "Server" not in r.stdout
    httpd = HTTPServer(("127.0.0.1", 0), _VersionHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        kc = kubeconfig(tmp_path, f"http://127.0.0.1:{httpd.server_port}")
        r = rose("version", "--kubeconfig", kc, "-o", "json")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["server"]["gitVersion"] == "v1.37.1"


def test_version_unreachable_server_is_one_line(tmp_path: Path) -> None:
    r = rose("version", env={"KUBECONFIG": kubeconfig(tmp_path)})
    assert r.stdout.startswith("Client Version: rose ")
    assert error_line(r).startswith(f"rose version: error: API server of {tmp_path / 'kubeconfig'} did not answer:")


def test_top_level_handler_turns_any_exception_into_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def boom() -> int:
        raise RuntimeError("the thing broke\nsecond line")

    assert run_command("demo", boom) == 1
    want = "rose demo: error: RuntimeError: the thing broke (set ROSE_DEBUG=1 for the traceback)"
    assert capsys.readouterr().err == want + "\n"
    in_use = OSError(98, "Address already in use")
    assert describe("x", in_use).startswith("rose x: error: address already in use:")


def test_completion_script_is_valid_bash(tmp_path: Path) -> None:
    r = rose("completion", "bash")
    assert r.returncode == 0 and "complete -F _rose rose" in r.stdout and "--plugin-dir" in r.stdout
    script = tmp_path / "rose.bash"
    script.write_text(r.stdout)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
