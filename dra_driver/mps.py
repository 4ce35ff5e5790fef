"""CUDA MPS control daemons for GPU shares (issue 27 §3): one per shared GPU, run by the driver.

A share claim's CDI spec points its containers at ``<state-dir>/mps/gpu-<N>/{pipe,log}``
(``shares.mps_mounts``) and sets its MPS limits (``shares.mps_env``); the limits hold only while
an MPS control daemon answers on that pipe directory. :class:`MpsDaemons` makes sure one does:

* the first claim prepared with a share device on GPU N (an RL share or serving's fraction) starts
  ``nvidia-cuda-mps-control -d`` with ``CUDA_VISIBLE_DEVICES=<GPU UUID>`` and that GPU's pipe and
  log directories, and waits until it answers; a daemon that does not start fails the prepare with
  one line (the kubelet retries) — a share is never prepared without its limits;
* a daemon already answering on the directory (a driver restarted beside it) is adopted, never
  started twice;
* when no claim with a share device is recorded on the GPU any more, ``quit`` stops it
  (:func:`to_stop`); a whole-GPU lent claim is prepared only on a GPU with no daemon
  (:func:`blocking_whole_lent`): the driver stops an idle one first, and refuses when it cannot.

Used only with real GPUs (``--gpu-backend nvml``); the simulated backend never starts a daemon. The
GPU's compute mode is left as it is (not ``EXCLUSIVE_PROCESS``): serving's whole device and a
reclaimed share's GPU must stay usable by processes that do not go through MPS (serving wins), so a
share's container that drops the CDI spec's MPS variables is not held to its limits.
Decisions are the pure functions; :class:`MpsDaemons` is the thin process I/O around them.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dra_driver.claims import PreparedDevice
from rose_common import names

log = logging.getLogger("rose.driver")

DEFAULT_CONTROL = "nvidia-cuda-mps-control"
MPS_DIR = "mps"  # under the driver's state directory
# The control client's query: answered by a running daemon, the client exits non-zero when none is
# there (the health check NVIDIA's own k8s-device-plugin MPS daemon uses)
PROBE_COMMAND = "get_default_active_thread_percentage\n"
QUIT_COMMAND = "quit\n"
# How long a stop waits for the daemon to go, under the node lock (MPS keeps a daemon whose clients
# are still connected after quit: the next try is the repair loop's), and how often the repair loop
# checks the daemons of prepared shares (each check is one control-client call per shared GPU)
STOP_WAIT_SECONDS = 3.0
RECHECK_SECONDS = 30.0


class MpsError(RuntimeError):
    """A daemon that could not be started or stopped; the message is one line."""


@dataclass(frozen=True)
class MpsDirs:
    pipe: Path
    log: Path


def dirs(root: Path, gpu_index: int) -> MpsDirs:
    """Pure: the pipe and log directories of GPU ``gpu_index``'s daemon (mounted by the CDI spec)."""
    base = root / f"gpu-{gpu_index}"
    return MpsDirs(base / "pipe", base / "log")


def daemon_env(base: Mapping[str, str], gpu_uuid: str, d: MpsDirs) -> dict[str, str]:
    """Pure: the environment of a control daemon (and its control client) for one GPU. A client's
    own MPS limits in the driver's environment are not passed on: they are a share's, not the daemon's."""
    env = {k: v for k, v in base.items() if not k.startswith("CUDA_MPS_")}
    env["CUDA_VISIBLE_DEVICES"] = gpu_uuid
    env[names.ENV_MPS_PIPE_DIRECTORY] = str(d.pipe)
    env[names.ENV_MPS_LOG_DIRECTORY] = str(d.log)
    return env


def share_gpus(devices: Iterable[PreparedDevice]) -> frozenset[int]:
    """Pure: the GPUs on which ``devices`` hold a share (an RL share or serving's fraction): those
    need their MPS daemon."""
    return frozenset(d.gpu_index for d in devices if d.role in names.SHARE_ROLES)


def to_stop(wanted: Collection[int], running: Collection[int]) -> list[int]:
    """Pure: the GPUs whose daemon runs while no recorded claim holds a share there."""
    return sorted(set(running) - set(wanted))


def blocking_whole_lent(devices: Iterable[PreparedDevice], running: Collection[int]) -> list[int]:
    """Pure: the GPUs of a whole-GPU lent claim (``lendable``) where a daemon runs. It must be
    stopped first: the claim is promised the whole GPU, not one an MPS server shares. Serving's
    whole device is never held back by a daemon (serving wins; its processes do not use MPS)."""
    return sorted({d.gpu_index for d in devices if d.role == names.ROLE_LENDABLE} & set(running))


def first_line(text: str, limit: int = 200) -> str:
    """Pure: the first non-empty line of a process's output, shortened (an error stays one line)."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


@dataclass
class MpsCounters:
    """Where the manager reports (``DriverMetrics`` wires these to its gauge and counters)."""

    daemons: Callable[[int], None] = lambda n: None
    start_failed: Callable[[], None] = lambda: None
    stop_failed: Callable[[], None] = lambda: None


class MpsDaemons:
    """The node's MPS control daemons, one per shared GPU, behind the node lock (not thread-safe
    on its own). ``uuids``: GPU index → UUID; ``root``: ``<state-dir>/mps``."""

    def __init__(
        self,
        control: str,
        root: Path,
        uuids: Mapping[int, str],
        *,
        counters: MpsCounters | None = None,
        timeout_seconds: float = 10.0,
        stop_wait_seconds: float = STOP_WAIT_SECONDS,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        if not control:
            raise ValueError("the MPS control binary must be named (--mps-control)")
        if timeout_seconds <= 0 or stop_wait_seconds <= 0:
            raise ValueError(f"the MPS daemon timeouts must be > 0 s, got {timeout_seconds} and {stop_wait_seconds}")
        self.control, self.root, self.uuids = control, root, dict(uuids)
        self.counters = counters or MpsCounters()
        self.timeout, self.stop_wait = timeout_seconds, stop_wait_seconds
        self._checked = float("-inf")
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._running: set[int] = set()

    def due(self, now: float) -> bool:
        """The repair loop's check of the daemons is due (at most every :data:`RECHECK_SECONDS`)."""
        if now - self._checked < RECHECK_SECONDS:
            return False
        self._checked = now
        return True

    def running(self) -> frozenset[int]:
        """The GPUs whose daemon this driver started or adopted (and has not stopped)."""
        return frozenset(self._running)

    def env(self, gpu: int) -> dict[str, str]:
        return daemon_env(self._base_env, self._uuid(gpu), dirs(self.root, gpu))

    def _uuid(self, gpu: int) -> str:
        uuid = self.uuids.get(gpu)
        if uuid is None:
            raise MpsError(f"GPU {gpu} is not on this node: no MPS daemon for it")
        return uuid

    def _client(self, gpu: int, command: str) -> subprocess.CompletedProcess[str]:
        """One control-client call on the GPU's pipe directory; raises MpsError when it cannot run."""
        try:
            return subprocess.run(
                [self.control],
                input=command,
                env=self.env(gpu),
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
            )
        except FileNotFoundError:
            raise MpsError(f"MPS control binary {self.control!r} not found (--mps-control)") from None
        except subprocess.TimeoutExpired:
            raise MpsError(f"MPS control client for GPU {gpu} did not answer within {self.timeout:g}s") from None
        except OSError as e:
            raise MpsError(f"MPS control binary {self.control!r} cannot run: {e}") from None

    def answers(self, gpu: int) -> bool:
        """A daemon answers on the GPU's pipe directory (the control client's query succeeds)."""
        if not dirs(self.root, gpu).pipe.is_dir():
            return False
        return self._client(gpu, PROBE_COMMAND).returncode == 0

    def adopt(self) -> list[int]:
        """At start: take over the daemons already answering on this node's pipe directories (a
        restarted driver), so none is started twice. Returns the GPUs adopted."""
        adopted = []
        for gpu in sorted(self.uuids):
            try:
                alive = self.answers(gpu)
            except MpsError as e:
                log.warning("mps daemon probe failed", extra={"gpu": gpu, "err": str(e)})
                continue
            if alive:
                self._running.add(gpu)
                adopted.append(gpu)
                log.info("mps daemon adopted", extra={"gpu": gpu, "pipeDir": str(dirs(self.root, gpu).pipe)})
        self.counters.daemons(len(self._running))
        return adopted

    def ensure(self, gpus: Iterable[int]) -> None:
        """Every GPU in ``gpus`` has a daemon answering: adopted if one answers, else started.
        Raises MpsError (one line, counted) when one does not start."""
        for gpu in sorted(set(gpus)):
            try:
                self._ensure_one(gpu)
            except MpsError:
                self.counters.start_failed()
                raise
            finally:
                self.counters.daemons(len(self._running))

    def _ensure_one(self, gpu: int) -> None:
        if self.answers(gpu):  # asked every time: a daemon that died must not leave shares unlimited
            if gpu not in self._running:
                log.info("mps daemon adopted", extra={"gpu": gpu, "pipeDir": str(dirs(self.root, gpu).pipe)})
            self._running.add(gpu)
            return
        self._running.discard(gpu)
        self._start(gpu)
        self._running.add(gpu)

    def _start(self, gpu: int) -> None:
        d = dirs(self.root, gpu)
        for path in (d.pipe, d.log):
            try:
                path.mkdir(parents=True, exist_ok=True, mode=0o755)
            except OSError as e:
                raise MpsError(f"cannot create the MPS directory {path}: {e}") from None
        t0 = time.monotonic()
        # the daemonized child may keep inherited descriptors: its output goes to a file, not a pipe
        with tempfile.TemporaryFile(mode="w+") as out:
            try:
                rc = subprocess.run(
                    [self.control, "-d"],
                    env=self.env(gpu),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=self.timeout,
                    check=False,
                ).returncode
            except FileNotFoundError:
                raise MpsError(f"MPS control binary {self.control!r} not found (--mps-control)") from None
            except (subprocess.TimeoutExpired, OSError) as e:
                raise MpsError(f"MPS control daemon for GPU {gpu} did not start: {e}") from None
            out.seek(0)
            said = first_line(out.read())
        if rc != 0:
            raise MpsError(f"MPS control daemon for GPU {gpu} exited {rc} at start: {said or 'no output'}")
        self._await(gpu, True, t0, self.timeout)
        log.info(
            "mps daemon started",
            extra={"gpu": gpu, "uuid": self._uuid(gpu), "pipeDir": str(d.pipe), "seconds": time.monotonic() - t0},
        )

    def _await(self, gpu: int, alive: bool, t0: float, limit: float) -> None:
        while self.answers(gpu) != alive:
            if time.monotonic() - t0 > limit:
                what = "did not answer" if alive else "still answers"
                when = f"within {limit:g}s of its start" if alive else f"{limit:g}s after quit"
                raise MpsError(f"MPS control daemon for GPU {gpu} {what} {when} (log: {dirs(self.root, gpu).log})")
            time.sleep(0.05)

    def stop(self, gpu: int) -> None:
        """``quit`` the GPU's daemon and wait (``stop_wait``) until it no longer answers; MpsError
        (counted) when it stays."""
        t0 = time.monotonic()
        try:
            if self.answers(gpu):
                r = self._client(gpu, QUIT_COMMAND)
                if r.returncode != 0:
                    said = first_line(r.stderr + r.stdout) or f"exit {r.returncode}"
                    raise MpsError(f"MPS control daemon for GPU {gpu} refused quit: {said}")
                self._await(gpu, False, t0, self.stop_wait)
        except MpsError:
            self.counters.stop_failed()
            raise
        self._running.discard(gpu)
        self.counters.daemons(len(self._running))
        log.info("mps daemon stopped", extra={"gpu": gpu, "seconds": time.monotonic() - t0})

    def sync(self, wanted: Collection[int]) -> list[str]:
        """Stop every daemon no recorded share needs (:func:`to_stop`); returns the errors (logged,
        counted; the repair loop tries again)."""
        errors = []
        for gpu in to_stop(wanted, self._running):
            try:
                self.stop(gpu)
            except MpsError as e:
                log.warning("mps daemon stop failed", extra={"gpu": gpu, "err": str(e)})
                errors.append(str(e))
        return errors
