"""Plays the container runtime for a claim's CDI spec without one: a host process started in its
own mount namespace (``unshare --mount --propagation private``; needs root) with the spec's mounts
bind-mounted at their container paths, the spec's environment, and the host directories named in
``hide`` covered by an empty tmpfs, so the process sees the claim's directories only where the
spec puts them (what a container sees), never at their host paths.

What it does not play: a new root file system, PID or user namespace, cgroups (the process stays
in the test's PID namespace, so the PID it reports is its own), the mounts' nosuid/nodev/noexec.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

# Runs as sh -c: an empty /run (the spec's mounts go under /run/rose), each mount bound at its
# container path, the hidden host directories covered, then exec the workload ("$@").
_SETUP = """set -e
mount -t tmpfs tmpfs /run
while [ "$1" != "--" ]; do
  case "$1" in
    bind) mkdir -p "$3"; mount --rbind "$2" "$3"; shift 3 ;;
    hide) mount -t tmpfs tmpfs "$2"; shift 2 ;;
  esac
done
shift
exec "$@"
"""


def available() -> bool:
    """Can this machine run it (root, util-linux's unshare and mount)?"""
    import os

    return os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("mount") is not None


def container_env(spec: dict[str, Any]) -> dict[str, str]:
    """The environment the spec's common and device edits give every container."""
    env: list[str] = list(spec.get("containerEdits", {}).get("env", []))
    for d in spec.get("devices", []):
        env += d.get("containerEdits", {}).get("env", [])
    return dict(e.split("=", 1) for e in env)


def container_argv(spec: dict[str, Any], hide: list[Path]) -> list[str]:
    """The argv prefix that starts a command as the spec's container would see the node."""
    args: list[str] = []
    for m in spec.get("containerEdits", {}).get("mounts", []):
        args += ["bind", m["hostPath"], m["containerPath"]]
    for h in hide:
        args += ["hide", str(h)]
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _SETUP, "sh", *args, "--"]
