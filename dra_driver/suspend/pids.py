"""Map the PID a workload reports (inside its container's PID namespace) to the PID the agent sees.

I/O boundary: reads ``<proc>/<pid>/cgroup`` and ``<proc>/<pid>/status`` only; writes nothing.

cuda-checkpoint addresses its target by PID in the *caller's* namespace (SUSPEND.md §1.3); a
workload in a pod reports ``os.getpid()`` in its own namespace. The agent runs with hostPID and
scans /proc: the process whose cgroup path names the pod UID and whose ``NSpid`` ends with the
reported PID is the one. When the pod UID is known, nothing else is: the reported PID is never
taken as is, since with hostPID a container's PID 1 is the host's init. Only a workload that
registered without a pod UID and lives in the agent's own namespace (one ``NSpid`` entry) is
taken as reported. Anything else is refused (``None``; the backend reports why): checkpointing
a wrong PID can disturb an unrelated process.

Every container of a pod has a PID namespace of its own (unless the pod shares one), so a
workload that is its container's first process reports PID 1, and so is the pod sandbox's
``pause`` process, in the same pod cgroup. When several processes of the pod match, the one the
claim's CDI spec started is taken: its environment (``/proc/<pid>/environ``, set by the runtime
at exec) names a claim (``ROSE_CLAIM_UID_*``, ``rose_common.names.claim_uid_env``); still several,
or none: refused.
"""

from __future__ import annotations

from pathlib import Path

from rose_common import names


def _nspids(status: str) -> list[int]:
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return [int(x) for x in line.split()[1:]]
    return []


def _pid_in_pod(pod_uid: str, reported_pid: int, proc: Path) -> int | None:
    """The process in the pod's cgroup whose innermost PID is ``reported_pid``."""
    forms = {pod_uid, pod_uid.replace("-", "_")}
    try:
        entries = list(proc.iterdir())
    except OSError:
        return None
    found: list[Path] = []
    for d in entries:
        if not d.name.isdigit():
            continue
        try:
            cgroup = (d / "cgroup").read_text()
            if not any(f in cgroup for f in forms):
                continue
            ns = _nspids((d / "status").read_text())
        except OSError:
            continue
        if ns and ns[-1] == reported_pid:
            found.append(d)
    if len(found) > 1:  # several containers' first processes (the sandbox's pause among them)
        found = [d for d in found if _names_a_claim(d)]
    return int(found[0].name) if len(found) == 1 else None


def _names_a_claim(d: Path) -> bool:
    """Was this process started with a claim's CDI edits (a ``ROSE_CLAIM_UID_*`` variable)?"""
    try:
        env = (d / "environ").read_bytes().split(b"\0")
    except OSError:
        return False
    prefix = names.ENV_CLAIM_UID_PREFIX.encode()
    return any(e.startswith(prefix) for e in env)


def _pid_in_own_namespace(reported_pid: int, proc: Path) -> int | None:
    try:
        own = _nspids((proc / str(reported_pid) / "status").read_text())
    except OSError:
        return None
    return reported_pid if len(own) == 1 else None


def resolve_pid(pod_uid: str, reported_pid: int, proc: Path = Path("/proc")) -> int | None:
    """The PID to pass to the driver API, or None when it cannot be determined safely."""
    if pod_uid:
        return _pid_in_pod(pod_uid, reported_pid, proc)
    return _pid_in_own_namespace(reported_pid, proc)
