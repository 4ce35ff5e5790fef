"""Which processes the CUDA driver's process checkpoint can move, and which must go one at a time.

NVIDIA documents (SUSPEND.md §1.1, §1.4): no UVM / managed memory, no CUDA IPC (except
``cuIpcGetMemHandle`` under a job file, r610+), no MPS, and NCCL jobs are not supported — while
one rank is locked or checkpointed, the other ranks' collectives (and any checkpoint call on them)
hang. Calls on the processes of one job must run one after another.

``unsupported_reasons`` and ``job_key`` are pure decisions over ``ProcessFacts``;
``read_process_facts`` is the only I/O (``/proc/<pid>/maps`` and ``/proc/<pid>/environ``, which
need the agent's hostPID and root or CAP_SYS_PTRACE). See README.md § "What cuda-checkpoint refuses".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# torchrun / torch.distributed, MPI launchers: more than one rank means collectives across processes.
_WORLD_SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
# Set for MPS clients that do not use the default pipe directory, and by MPS resource limits.
_MPS_VARS = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
JOB_FILE_VAR = "CUDA_CHECKPOINT_JOB_FILE"


@dataclass(frozen=True)
class ProcessFacts:
    """What /proc says about a process; ``unreadable`` names what could not be read (and why)."""

    maps: str = ""
    environ: dict[str, str] = field(default_factory=dict)
    unreadable: tuple[str, ...] = ()


def _world_size(environ: dict[str, str]) -> tuple[str, int] | None:
    for var in _WORLD_SIZE_VARS:
        raw = environ.get(var, "").strip()
        if raw.isdigit() and int(raw) > 1:
            return var, int(raw)
    return None


def unsupported_reasons(facts: ProcessFacts) -> list[str]:
    """Pure: why cuda-checkpoint must not touch this process (empty: nothing detected)."""
    reasons: list[str] = []
    ws = _world_size(facts.environ)
    if ws is not None:
        reasons.append(
            f"it is one rank of a multi-process job ({ws[0]}={ws[1]}): NCCL / collective jobs are not"
            " supported by the CUDA driver's checkpoint (locking one rank hangs the others)"
        )
    if "/dev/shm/nccl-" in facts.maps:
        reasons.append(
            "it has an NCCL communicator (/dev/shm/nccl-* mapped): NCCL jobs are not supported by the CUDA"
            " driver's checkpoint"
        )
    mps = sorted(v for v in _MPS_VARS if facts.environ.get(v))
    if mps or "nvidia-mps" in facts.maps:
        reasons.append(
            f"it is an MPS client ({', '.join(mps) or 'nvidia-mps mapped'}): MPS is not supported by the CUDA"
            " driver's checkpoint"
        )
    return reasons


def job_key(pod_uid: str, facts: ProcessFacts) -> str:
    """Pure: the processes whose checkpoint calls must be serialised share this key — the CUDA
    checkpoint job file when the process was started under one (``--launch-job``), else its pod."""
    job_file = facts.environ.get(JOB_FILE_VAR, "")
    return f"job-file:{job_file}" if job_file else f"pod:{pod_uid}"


def parse_environ(raw: bytes) -> dict[str, str]:
    """Pure: ``/proc/<pid>/environ`` (NUL-separated ``KEY=value``) as a dict."""
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def read_process_facts(pid: int, proc: Path = Path("/proc")) -> ProcessFacts:
    """Read the maps and the start-up environment of ``pid``; a file that cannot be read is named."""
    d = proc / str(pid)
    unreadable: list[str] = []
    maps = ""
    environ: dict[str, str] = {}
    try:
        maps = (d / "maps").read_text(errors="replace")
    except OSError as e:
        unreadable.append(f"{d / 'maps'}: {e.strerror or e}")
    try:
        environ = parse_environ((d / "environ").read_bytes())
    except OSError as e:
        unreadable.append(f"{d / 'environ'}: {e.strerror or e}")
    return ProcessFacts(maps, environ, tuple(unreadable))
