"""``local_cluster.cluster.dying_with_parent``: a child started through it dies with the thread that
started it, and no Python runs between fork and exec where ``setpriv`` exists."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from local_cluster.cluster import dying_with_parent

REPO = Path(__file__).resolve().parents[3]

PARENT = """
import subprocess, sys
from local_cluster.cluster import dying_with_parent
argv, preexec = dying_with_parent(["sleep", "300"])
child = subprocess.Popen(argv, preexec_fn=preexec)
print(child.pid, flush=True)
sys.stdin.readline()
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _argv0(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")[0]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="util-linux setpriv not installed")
def test_setpriv_sets_the_death_signal_so_no_python_runs_in_the_child() -> None:
    argv, preexec = dying_with_parent(["kube-apiserver", "--v=2"])
    assert preexec is None
    assert argv[1:4] == ["--pdeathsig", "KILL", "--"] and argv[4:] == ["kube-apiserver", "--v=2"]


def test_the_child_is_killed_when_its_parent_dies() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert _alive(child)
        deadline = time.monotonic() + 30
        while _argv0(child) != b"sleep" and time.monotonic() < deadline:  # setpriv execs it in place
            time.sleep(0.05)
        assert _argv0(child) == b"sleep"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the child outlived its parent"
    finally:
        if _alive(child):
            os.kill(child, 9)
        parent.kill()
        parent.communicate()
