"""``rose version``: the client's version and, given a kubeconfig, the API server's (``GET /version``).

I/O boundary: the installed package metadata, one GET of ``/version`` through the official
client when a kubeconfig is given (``--kubeconfig`` or ``$KUBECONFIG``), and stdout.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib import metadata
from typing import Any

from rose_common.cli import EnvArgumentParser

SERVER_TIMEOUT_S = 5.0


def client_version() -> dict[str, str]:
    """The installed ``rose`` distribution's version and the Python it runs on."""
    try:
        version = metadata.version("rose")
    except metadata.PackageNotFoundError:
        version = "unknown (not installed as a package)"
    return {"version": version, "python": platform.python_version()}


def server_version(kubeconfig: str) -> dict[str, Any]:
    """The API server's ``/version`` document (``gitVersion``, ``platform``, ...)."""
    from rose_common.kube.client import Raw, api_client

    resp = Raw(api_client(kubeconfig)).call("GET", "/version", timeout=SERVER_TIMEOUT_S)
    reply = json.loads(resp.read() or b"{}")
    return dict(reply) if isinstance(reply, dict) else {"gitVersion": str(reply)}


def render(client: dict[str, str], server: dict[str, Any] | None, output: str) -> str:
    """The text (``-o text``) or JSON (``-o json``) report."""
    if output == "json":
        return json.dumps({"client": client, "server": server}, indent=2, sort_keys=True)
    lines = [f"Client Version: rose {client['version']} (Python {client['python']})"]
    if server is not None:
        lines.append(f"Server Version: {server.get('gitVersion', '?')} ({server.get('platform', '?')})")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = EnvArgumentParser(env_prefix="ROSE_", prog="rose version", description=__doc__)
    p.flag(
        "--kubeconfig",
        env="KUBECONFIG",
        default="",
        help="kubeconfig of the cluster whose API server version to show; empty: the client's only",
    )
    p.add_argument("-o", "--output", choices=["text", "json"], default="text", help="output format")
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit 0; 1 when a kubeconfig was given and its API server did not answer (said on stderr)."""
    args = build_parser().parse_args(argv)
    client = client_version()
    server: dict[str, Any] | None = None
    failure = ""
    if args.kubeconfig:
        try:
            server = server_version(args.kubeconfig)
        except Exception as e:  # unreachable, refused, bad kubeconfig: the client version still prints
            failure = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    print(render(client, server, args.output))
    if failure:
        print(f"rose version: error: API server of {args.kubeconfig} did not answer: {failure}", file=sys.stderr)
        return 1
    return 0
