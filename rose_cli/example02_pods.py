"""Example 02 (``examples/02_grpo_tiny_llm/train.py``) as the processes of an ElasticRLJob's pods
on KWOK nodes (KWOK runs no containers), for ``rose demo``'s act 6 (``rose_cli/demo_rollouts.py``)
and ``tests/e2e/elastic_controller/test_example02_cluster_e2e.py``: ``ProcessKubelet`` plays the kubelet — for every
Running pod of the job it starts the pod's command as a local process, with the pod's env, and
SIGTERMs that process when the pod is deleted.

What it changes, and says so: ``python`` is this interpreter; the trainer's ``train.py`` runs
through ``rose_cli/example02_role.py`` (the same ``main``, plus gates and the final weights saved);
the trainer's ``--out`` goes under the run's tmp dir and it listens on a free loopback port
(``--port 0``), and every rollout's ``ROSE_TRAINER_ADDR`` (the trainer's headless-Service DNS name,
which nothing resolves here) is rewritten to that ``127.0.0.1:<port>``; ``fieldRef`` env
(pod name, uid, namespace) is filled in from the pod as the kubelet does; the rollout token, which
a real job mounts from a Secret, is the caller's. ``prepare`` (optional) plays the kubelet's DRA
step before a pod's container starts: it returns the env the pod's claims add (a real driver's
node-agent socket, through ``rose_cli.demo_rollouts.driver_prepare``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from rose_common import names

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "02_grpo_tiny_llm" / "train.py"
ROLE_RUNNER = REPO / "rose_cli" / "example02_role.py"
COUNTERS = re.compile(r"rollout: submitted=(\d+) accepted=(\d+) duplicate=(\d+) stale=(\d+) requeued=(\d+)")
SUSPENDS = re.compile(r" suspends=(\d+) resumes=(\d+)")


def role_env(token: str, **extra: str) -> dict[str, str]:
    """A role's environment: this one without ``ROSE_*``, the repository importable, the job's token."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_")}
    return {**clean, "PYTHONPATH": str(REPO), "ROSE_ROLLOUT_TOKEN": token, "TRL_EXPERIMENTAL_SILENCE": "1", **extra}


def counters(lines: list[str]) -> dict[str, int]:
    """The trainer's last words on its rollout service's prompt counters and its suspends (pure)."""
    out: dict[str, int] = {}
    for line in reversed(lines):
        if not out and (m := COUNTERS.search(line)):
            keys = ("submitted", "accepted", "duplicate", "stale", "requeued")
            out.update(zip(keys, (int(g) for g in m.groups()), strict=True))
        if out and (s := SUSPENDS.search(line)):
            out["suspends"], out["resumes"] = int(s.group(1)), int(s.group(2))
            return out
    raise ValueError(f"the trainer printed no rollout counters: {''.join(lines)[-3000:]}")


class Trainer:
    """``train.py --role trainer`` (through ``example02_role.py``): its output lines collected."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.lines: list[str] = []
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, str(ROLE_RUNNER), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out: IO[str] | None = self.proc.stdout
        assert out is not None
        with self.log.open("w") as f:
            for line in out:
                f.write(line)
                f.flush()
                with self._cond:
                    self.lines.append(line)
                    self._cond.notify_all()
        out.close()
        with self._cond:
            self._cond.notify_all()

    def await_line(self, prefix: str, timeout: float = 120.0) -> str:
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                if self.proc.stdout is not None and self.proc.stdout.closed:
                    break
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
        raise TimeoutError(f"no {prefix!r} from the trainer (rc={self.proc.poll()}): {''.join(self.lines)[-3000:]}")

    def address(self, timeout: float = 120.0) -> str:
        return self.await_line("ROLLOUT_SERVICE ", timeout).split()[1]


class ProcessKubelet:
    """Plays the kubelet for job ``job``'s pods in ``ns`` (see the module docstring)."""

    def __init__(
        self,
        api: Any,
        ns: str,
        job: str,
        tmp: Path,
        trainer_env: dict[str, str],
        token: str,
        prepare: Callable[[Any], dict[str, str]] | None = None,
    ) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.ns, self.job, self.tmp, self.trainer_env = ns, job, tmp, trainer_env
        self.token, self.prepare = token, prepare
        self.t0 = time.monotonic()
        # (seconds since start, rollout processes running, the trainer pod's suspend state) at each sync
        self.samples: list[tuple[float, int, str]] = []
        self.trainer: Trainer | None = None
        self.trainer_addr: str | None = None
        self.procs: dict[str, tuple[str, subprocess.Popen[Any]]] = {}  # pod uid -> (pod name, process)
        self.events: list[tuple[float, str, str]] = []  # (monotonic, "start"|"sigterm", pod name)
        self.errors: list[str] = []
        self.phases: dict[str, str] = {}  # the job's live pods at the last sync, by name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="process-kubelet", daemon=True)

    def __enter__(self) -> ProcessKubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for _, p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()

    def check(self) -> bool:
        """Raise the kubelet's errors, if it had any; else False (``check() or condition`` polls both)."""
        if self.errors:
            raise RuntimeError(f"the played kubelet failed: {self.errors[-3:]}")
        return False

    def running(self, role: str) -> list[str]:
        """Names of the pods of ``role`` whose process runs."""
        return sorted(n for n, p in self.procs.values() if p.poll() is None and f"-{role}-" in n)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception as e:  # a failed sync is retried; the test sees it in errors
                self.errors.append(repr(e))
            self._stop.wait(0.2)

    def _sync(self) -> None:
        pods = self.core.list_namespaced_pod(self.ns, label_selector=f"{names.LABEL_JOB}={self.job}").items
        live = {p.metadata.uid: p for p in pods if p.metadata.deletion_timestamp is None}
        self.phases = {
            p.metadata.name: f"{p.status.phase} {[c.message for c in p.status.conditions or []]}" for p in live.values()
        }
        for uid, (name, p) in self.procs.items():
            if uid not in live and p.poll() is None and p.returncode is None and not getattr(p, "_termed", False):
                p.send_signal(signal.SIGTERM)
                p._termed = True  # type: ignore[attr-defined]
                self.events.append((time.monotonic(), "sigterm", name))
        trainer_pod = [p for p in live.values() if f"{self.job}-trainer-" in p.metadata.name]
        state = (
            (trainer_pod[0].metadata.annotations or {}).get(names.ANNOTATION_SUSPEND_STATE) or "Running"
            if trainer_pod and self.trainer is not None
            else "-"
        )
        self.samples.append((time.monotonic() - self.t0, len(self.running("rollout")), state))
        tr = self.trainer
        if tr is not None and self.trainer_addr is None and any(x.startswith("ROLLOUT_SERVICE ") for x in tr.lines):
            self.trainer_addr = tr.address(1)
        for uid, pod in sorted(live.items(), key=lambda kv: str(kv[1].metadata.name)):
            if uid in self.procs or pod.status.phase != "Running":
                continue
            role = (pod.metadata.labels or {}).get(f"{names.LABEL_PREFIX}/rl-role")
            if role == "rollout" and self.trainer_addr is None:
                continue  # its ROSE_TRAINER_ADDR is rewritten to the trainer process's port: wait for it
            self._start(pod, str(role))

    def _start(self, pod: Any, role: str) -> None:
        c = pod.spec.containers[0]
        # status.podIP: every process here shares the loopback
        fields = {
            "metadata.name": pod.metadata.name,
            "metadata.uid": pod.metadata.uid,
            "metadata.namespace": pod.metadata.namespace,
            "status.podIP": "127.0.0.1",
        }
        env = role_env(self.token)
        for e in c.env or []:
            if e.value is not None:
                env[e.name] = e.value
            elif e.value_from is not None and e.value_from.field_ref is not None:
                env[e.name] = fields[e.value_from.field_ref.field_path]
        cmd = list(c.command or []) + list(c.args or [])
        if cmd[:2] != ["python", "examples/02_grpo_tiny_llm/train.py"]:
            raise ValueError(f"pod {pod.metadata.name}: not example 02's train.py: {cmd}")
        args = cmd[2:]
        log = self.tmp / f"{pod.metadata.name}.log"
        if self.prepare is not None:
            env.update(self.prepare(pod))
        if role == "trainer":
            i = args.index("--out")
            args[i + 1] = str(self.tmp / "trainer-out")
            self.trainer = Trainer([*args, "--port", "0"], {**env, **self.trainer_env}, log)
            proc: subprocess.Popen[Any] = self.trainer.proc
        else:
            env["ROSE_TRAINER_ADDR"] = str(self.trainer_addr)
            with log.open("w") as f:
                proc = subprocess.Popen(
                    [sys.executable, str(TRAIN), *args], env=env, stdout=f, stderr=subprocess.STDOUT
                )
        self.procs[pod.metadata.uid] = (pod.metadata.name, proc)
        self.events.append((time.monotonic(), "start", pod.metadata.name))


def rollout(addr: str, name: str, log: Path, token: str, args: list[str] | None = None) -> subprocess.Popen[bytes]:
    """``train.py --role rollout`` as a plain process: one worker of ``addr``'s trainer."""
    cmd = [sys.executable, str(TRAIN), "--role", "rollout", *(args or ["--batch", "1"])]
    with log.open("w") as f:
        return subprocess.Popen(
            cmd, env=role_env(token, ROSE_TRAINER_ADDR=addr, ROSE_POD_NAME=name), stdout=f, stderr=subprocess.STDOUT
        )


def constant_world_run(tmp: Path, steps: int, token: str) -> tuple[Path, dict[str, int]]:
    """The reference: the trainer and one rollout worker for the whole run, never suspended. Its
    weights' file (``ROSE_EXAMPLE_WEIGHTS``) and counters."""
    weights = tmp / "constant.pt"
    tr = Trainer(
        ["--role", "trainer", "--out", str(tmp / "constant-out"), "--max-steps", str(steps), "--port", "0"],
        role_env(token, ROSE_EXAMPLE_WEIGHTS=str(weights)),
        tmp / "constant-trainer.log",
    )
    w = rollout(tr.address(), "constant-0", tmp / "constant-rollout.log", token)
    try:
        if tr.proc.wait(timeout=300) != 0:
            raise RuntimeError(f"the constant-world trainer failed: {''.join(tr.lines)[-3000:]}")
        if w.wait(timeout=60) != 0:
            raise RuntimeError(
                f"the constant-world rollout failed: {(tmp / 'constant-rollout.log').read_text()[-2000:]}"
            )
    finally:
        for p in (tr.proc, w):
            if p.poll() is None:
                p.kill()
                p.wait()
    return weights, counters(tr.lines)
