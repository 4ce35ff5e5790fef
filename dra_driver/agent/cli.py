"""``python -m dra_driver.agent``: the node agent on its own (the DRA driver embeds the same engine).

Every flag also reads the environment variable ROSE_AGENT_<FLAG> (upper case, dashes as
underscores); the command line wins.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dra_driver.agent.server import AgentServer
from dra_driver.suspend.cuda_checkpoint import CudaCheckpointUnavailable
from dra_driver.suspend.engine import EngineConfig
from dra_driver.suspend.factory import build_engine
from dra_driver.suspend.model import BACKENDS
from rose_common import httpserver, runner
from rose_common.cli import EnvArgumentParser, duration, port_type

log = logging.getLogger("rose.agent")
_ENV_PREFIX = "ROSE_AGENT_"


def default_host_budget_bytes() -> int:
    """Half of the node's MemTotal: the other half stays for the workloads and the system."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = EnvArgumentParser(
        env_prefix=_ENV_PREFIX,
        prog="rose-agent",
        description="ROSE node agent: suspend engine + rose.agent.v1 gRPC on unix sockets. "
        "Each flag can also be set as ROSE_AGENT_<FLAG> (e.g. ROSE_AGENT_BACKENDS=cooperative,simulated).",
    )

    def add(flag: str, default: str, help_: str, type_: Callable[[str], Any] = str) -> None:
        p.flag(f"--{flag}", default=default, type=type_, help=help_)

    add(
        "workload-socket",
        "/var/lib/rose/agent/workload.sock",
        "unix socket for workload pods (WorkloadAgent)",
    )
    add("control-socket", "/var/lib/rose/agent/control.sock", "unix socket for controllers (NodeControl)")
    add(
        "backends",
        "cooperative",
        f"enabled suspend backends in preference order, comma-separated: {BACKENDS}",
    )
    add("host-memory-budget-bytes", "-1", "host memory suspended state may hold; -1 = half of MemTotal", int)
    add("checkpoint-timeout-seconds", "60", "how long the fallback waits for a durable checkpoint", duration)
    add("resume-timeout-seconds", "120", "how long a resume waits for the workload", duration)
    add("simulated-host-link-gbps", "55", "simulated backend: host link GB/s per direction", float)
    add("simulated-occupant-bytes", "0", "simulated backend: size of an unregistered claim's occupant", int)
    add("libcuda", "libcuda.so.1", "libcuda to load for the cuda-checkpoint backend")
    add("node-name", os.environ.get("NODE_NAME", ""), "this node's name (reported to workloads)")
    add("metrics-port", "0", "serve Prometheus metrics on this port (0 = off)", port_type(0, "0: off"))
    add("metrics-address", "127.0.0.1", "address of the metrics listener")
    add("log-level", "info", "debug, info, warning or error")
    return p


def main(argv: list[str] | None = None) -> int:
    return runner.run("rose-agent", lambda: build_parser().parse_args(argv), serve)


def serve(args: argparse.Namespace, r: runner.Runner) -> int:
    backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    budget = args.host_memory_budget_bytes if args.host_memory_budget_bytes >= 0 else default_host_budget_bytes()
    try:
        config = EngineConfig(
            host_memory_budget_bytes=budget,
            backends=backends,
            checkpoint_timeout_seconds=args.checkpoint_timeout_seconds,
            resume_timeout_seconds=args.resume_timeout_seconds,
            simulated_occupant_bytes=args.simulated_occupant_bytes,
            node_name=args.node_name,
        )
        engine = build_engine(
            config,
            simulated_host_link_bytes_per_second=args.simulated_host_link_gbps * 1e9,
            libcuda_path=args.libcuda,
        )
    except (ValueError, CudaCheckpointUnavailable) as e:
        print(f"rose-agent: {e}", file=sys.stderr)
        return 2
    server = AgentServer(engine, Path(args.workload_socket), Path(args.control_socket))
    if args.metrics_port:
        try:
            httpserver.serve_probes(
                (args.metrics_address, args.metrics_port), registry=engine.metrics.registry, name="agent"
            )
        except OSError as err:
            print(f"rose-agent: --metrics-port {args.metrics_port}: {err.strerror or err}", file=sys.stderr)
            return 2
    server.start()
    r.stop.wait()
    log.info("agent stopping")
    server.stop()
    return 0
