"""Example 02 (``examples/02_grpo_tiny_llm/train.py``) as processes, for the tests that run it:
the environment its roles need, a reference run with a constant rollout world, and
``ProcessKubelet``, which plays the kubelet for an ElasticRLJob's pods on KWOK nodes (KWOK runs
no containers): for every Running pod of the job it starts the pod's command as a local process,
with the pod's env, and SIGTERMs that process when the pod is deleted.

What it changes, and says so: ``python`` is this interpreter; the trainer's ``train.py`` runs
through ``tests/support/example02_role.py`` (the same ``main``, plus gates and the final weights saved);
the trainer's ``--out`` goes under the test's tmp dir and it listens on a free loopback port
(``--port 0``), and every rollout's ``ROSE_TRAINER_ADDR`` (the trainer's headless-Service DNS name,
which nothing resolves here) is rewritten to that ``127.0.0.1:<port>``; ``fieldRef`` env
(pod name, uid, namespace) is filled in from the pod as the kubelet does; the rollout token, which
a real job mounts from a Secret, comes from the test's env.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from kubernetes import client

from rose_common import names

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "02_grpo_tiny_llm" / "train.py"
ROLE_RUNNER = REPO / "tests" / "support" / "example02_role.py"
TOKEN = "test-token-0123456789abcdef"
COUNTERS = re.compile(r"rollout: submitted=(\d+) accepted=(\d+) duplicate=(\d+) stale=(\d+) requeued=(\d+)")


def role_env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_")}
    return {**clean, "PYTHONPATH": str(REPO), "ROSE_ROLLOUT_TOKEN": TOKEN, "TRL_EXPERIMENTAL_SILENCE": "1", **extra}


def counters(lines: list[str]) -> dict[str, int]:
    """The trainer's last words on its rollout service's prompt counters."""
    for line in reversed(lines):
        if m := COUNTERS.search(line):
            keys = ("submitted", "accepted", "duplicate", "stale", "requeued")
            return dict(zip(keys, (int(g) for g in m.groups()), strict=True))
    raise AssertionError(f"the trainer printed no rollout counters: {''.join(lines)[-3000:]}")


class Trainer:
    """``train.py --role trainer`` (through ``example02_role.py``): its output lines collected."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.lines: list[str] = []
        self.log = log
        self.proc = subprocess.Popen([sys.executable, str(ROLE_RUNNER), *args], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)  # fmt: skip
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
        raise AssertionError(f"no {prefix!r} from the trainer (rc={self.proc.poll()}): {''.join(self.lines)[-3000:]}")

    def address(self, timeout: float = 120.0) -> str:
        return self.await_line("ROLLOUT_SERVICE ", timeout).split()[1]


def rollout(addr: str, name: str, log: Path, args: list[str] | None = None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, str(TRAIN), "--role", "rollout", *(args or ["--batch", "1"])]
    with log.open("w") as f:
        return subprocess.Popen(cmd, env=role_env(ROSE_TRAINER_ADDR=addr, ROSE_POD_NAME=name), stdout=f,
                                stderr=subprocess.STDOUT)  # fmt: skip


def constant_world_run(tmp: Path, steps: int) -> tuple[Path, dict[str, int]]:
    """The reference: the trainer and one rollout worker for the whole run. Its weights' file and counters."""
    weights = tmp / "constant.pt"
    tr = Trainer(["--role", "trainer", "--out", str(tmp / "constant-out"), "--max-steps", str(steps), "--port", "0"],
                 role_env(ROSE_TEST_WEIGHTS=str(weights)), tmp / "constant-trainer.log")  # fmt: skip
    w = rollout(tr.address(), "constant-0", tmp / "constant-rollout.log")
    try:
        assert tr.proc.wait(timeout=300) == 0, "".join(tr.lines)[-3000:]
        assert w.wait(timeout=60) == 0, (tmp / "constant-rollout.log").read_text()[-2000:]
    finally:
        for p in (tr.proc, w):
            if p.poll() is None:
                p.kill()
                p.wait()
    return weights, counters(tr.lines)


class ProcessKubelet:
    """Plays the kubelet for job ``job``'s pods in ``ns`` (see the module docstring)."""

    def __init__(self, api: Any, ns: str, job: str, tmp: Path, trainer_env: dict[str, str]) -> None:
        self.core = client.CoreV1Api(api)
        self.ns, self.job, self.tmp, self.trainer_env = ns, job, tmp, trainer_env
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

    def check(self) -> None:
        """Fail the test with the kubelet's errors, if it had any."""
        assert not self.errors, self.errors[-3:]

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
        self.phases = {p.metadata.name: f"{p.status.phase} {[c.message for c in p.status.conditions or []]}"
                       for p in live.values()}  # fmt: skip
        for uid, (name, p) in self.procs.items():
            if uid not in live and p.poll() is None and p.returncode is None and not getattr(p, "_termed", False):
                p.send_signal(signal.SIGTERM)
                p._termed = True  # type: ignore[attr-defined]
                self.events.append((time.monotonic(), "sigterm", name))
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
        fields = {"metadata.name": pod.metadata.name, "metadata.uid": pod.metadata.uid,
                  "metadata.namespace": pod.metadata.namespace,
                  "status.podIP": "127.0.0.1"}  # fmt: skip
        env = role_env()
        for e in c.env or []:
            if e.value is not None:
                env[e.name] = e.value
            elif e.value_from is not None and e.value_from.field_ref is not None:
                env[e.name] = fields[e.value_from.field_ref.field_path]
        cmd = list(c.command or []) + list(c.args or [])
        assert cmd[:2] == ["python", "examples/02_grpo_tiny_llm/train.py"], cmd
        args = cmd[2:]
        log = self.tmp / f"{pod.metadata.name}.log"
        if role == "trainer":
            i = args.index("--out")
            args[i + 1] = str(self.tmp / "trainer-out")
            self.trainer = Trainer([*args, "--port", "0"], {**env, **self.trainer_env}, log)
            proc: subprocess.Popen[Any] = self.trainer.proc
        else:
            assert self.trainer_addr is not None
            env["ROSE_TRAINER_ADDR"] = self.trainer_addr
            with log.open("w") as f:
                proc = subprocess.Popen([sys.executable, str(TRAIN), *args], env=env, stdout=f,
                                        stderr=subprocess.STDOUT)  # fmt: skip
        self.procs[pod.metadata.uid] = (pod.metadata.name, proc)
        self.events.append((time.monotonic(), "start", pod.metadata.name))
