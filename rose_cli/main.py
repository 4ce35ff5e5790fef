"""`rose`: one command with a sub-command per component.

    rose cluster up|down|status|env     the local Kubernetes (development and tests)
    rose extender ...                   the kube-scheduler HTTP extender
    rose controller ...                 the ElasticRLJob controller and reclaim planner
    rose driver ...                     the DRA node driver and suspend engine
    rose predictor ...                  the serving-demand forecaster (serve, backtest, generate)
    rose timeslice serve|advise         the time-slice orchestrator (acquire / yield a GPU group)
    rose simulate                       one serving fleet under several lending policies, trace-driven
    rose demo                           the whole story on a local cluster
    rose dashboard generate|check|preview  the Grafana dashboard as code, and a PNG preview of its panels
    rose version                        the client's version and, with a kubeconfig, the API server's
    rose completion bash                a bash completion script for the sub-commands

Any error a sub-command raises is one line on stderr (``rose <command>: error: ...``) and exit
status 1; ``ROSE_DEBUG=1`` adds the traceback (rose_cli.errors). A flag error, an unknown command
and a long-running component's failure at start (``rose_common.runner``) are one line and status 2.

Each component's own parser handles its arguments; components are imported only when their
sub-command runs, so the CLI never couples them.
"""

from __future__ import annotations

import importlib
import sys

from rose_cli.errors import run_command

COMMANDS: dict[str, tuple[str, str]] = {
    "cluster": ("local_cluster.cli", "the local Kubernetes: up, down, status, env"),
    "extender": ("scheduler_extender.cli", "the kube-scheduler HTTP extender"),
    "controller": ("elastic_controller.cli", "the ElasticRLJob controller (reconcile, reclaim planner)"),
    "driver": ("dra_driver.cli", "the DRA node driver (kubelet plugin, slices, suspend engine)"),
    "agent": ("dra_driver.agent.cli", "the node agent alone (suspend engine, workload socket)"),
    "predictor": ("predictor.cli", "serving-demand forecasts: serve, backtest, generate"),
    "timeslice": ("timeslice.cli", "the time-slice orchestrator: serve (gRPC Acquire / Yield), advise"),
    "simulate": ("rose_sim.cli", "one serving fleet under several lending policies, from a demand trace"),
    "demo": ("rose_cli.demo", "the whole story on a local cluster"),
    "dashboard": ("rose_cli.dashboard", "the Grafana dashboard as code: generate, check, preview (PNG)"),
    "version": ("rose_cli.version", "the client's version; with --kubeconfig also the API server's"),
    "completion": ("rose_cli.completion", "print a bash completion script: source <(rose completion bash)"),
}


def usage() -> str:
    lines = ["usage: rose <command> [args...]", "", "commands:"]
    lines += [f"  {name:<11} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`rose <command> --help` for a command's flags."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    cmd, rest = args[0], args[1:]
    if cmd not in COMMANDS:
        print(f"rose: error: unknown command {cmd!r} (see `rose --help`)", file=sys.stderr)
        return 2
    module_name = COMMANDS[cmd][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            print(f"rose: {cmd!r} is not available in this build ({module_name} is missing)", file=sys.stderr)
            return 2
        raise
    return run_command(cmd, lambda: module.main(rest))


if __name__ == "__main__":
    sys.exit(main())
