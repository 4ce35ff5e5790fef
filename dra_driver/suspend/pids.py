"""Map the PID a workload reports (inside its container's PID namespace) to the PID the agent sees.

cuda-checkpoint addresses its target by PID in the *caller's* namespace (SUSPEND.md §1.3); a
workload in a pod reports ``os.getpid()`` in its own namespace. The agent runs with hostPID and
scans /proc: the process whose cgroup path names the pod UID and whose ``NSpid`` ends with the
reported PID is the one. A process in the agent's own namespace (one ``NSpid`` entry) is taken
as is. Anything else is refused: checkpointing a wrong PID can disturb an unrelated process.
"""

from __future__ import annotations

from pathlib import Path


def _nspids(status: str) -> list[int]:
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return [int(x) for x in line.split()[1:]]
    return []


def resolve_pid(pod_uid: str, reported_pid: int, proc: Path = Path("/proc")) -> int | None:
    """The PID to pass to the driver API, or None when it cannot be determined safely."""
    forms = {pod_uid, pod_uid.replace("-", "_")} if pod_uid else set()
    if forms:
        try:
            entries = list(proc.iterdir())
        except OSError:
            entries = []
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
                return int(d.name)
    try:
        own = _nspids((proc / str(reported_pid) / "status").read_text())
    except OSError:
        return None
    return reported_pid if len(own) == 1 else None
