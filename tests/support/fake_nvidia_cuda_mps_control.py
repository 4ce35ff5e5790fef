#!/usr/bin/env python3
"""FAKE ``nvidia-cuda-mps-control``, for tests only: there is no GPU (and no CUDA MPS) on the machines
that run the contract tier. It behaves like the real control binary where the driver relies on it,
so ``dra_driver.mps`` runs against real processes; it starts no MPS server and limits nothing.

* ``-d``: daemonizes (the invoking process returns at once, as the real one does) and serves a
  control socket ``control`` in ``CUDA_MPS_PIPE_DIRECTORY`` (the real daemon's control socket has
  that name); its pid goes to ``fake-mps-control.pid`` there, and ``started pid=<pid>
  CUDA_VISIBLE_DEVICES=<value>`` to ``control.log`` in ``CUDA_MPS_LOG_DIRECTORY``. Refused (exit 1)
  while a daemon answers on the directory, or when either directory is missing.
* no argument (a client): sends each line of stdin to the daemon and prints each answer;
  ``get_server_list`` answers an empty list, ``get_default_active_thread_percentage`` 100.0, ``quit``
  stops the daemon. No daemon: ``Cannot find
  MPS control daemon process`` on stderr, exit 1.

Test knobs (environment of the ``-d`` call): ``FAKE_MPS_CONTROL_FAIL_START=<message>`` fails the
start with that message (exit 1); ``FAKE_MPS_CONTROL_START_DELAY=<seconds>`` makes the daemon open
its socket that much later (a slow or hung start). While a file ``fake-ignore-quit`` is in the pipe
directory, ``quit`` is acknowledged and the daemon keeps running (as the real one does while MPS
clients are still connected).
"""

from __future__ import annotations

import os
import socket
import sys
import time

CONTROL = "control"
PIDFILE = "fake-mps-control.pid"
IGNORE_QUIT = "fake-ignore-quit"


def _dirs() -> tuple[str, str]:
    return (
        os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"),
        os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"),
    )


def _connect(pipe: str) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.chdir(pipe)  # a relative name: the pipe directory may be longer than a socket path may be
        s.connect(CONTROL)
    except OSError:
        s.close()
        return None
    return s


def client() -> int:
    conn = _connect(_dirs()[0])
    if conn is None:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    with conn, conn.makefile("rw") as f:
        for line in sys.stdin:
            if line.strip():
                f.write(line.strip() + "\n")
                f.flush()
                print(f.readline().rstrip("\n"))
    return 0


def daemonize() -> int:
    pipe, logs = _dirs()
    if msg := os.environ.get("FAKE_MPS_CONTROL_FAIL_START"):
        print(msg, file=sys.stderr)
        return 1
    for d in (pipe, logs):
        if not os.path.isdir(d):
            print(f"directory {d} does not exist", file=sys.stderr)
            return 1
    if (conn := _connect(pipe)) is not None:
        conn.close()
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    if os.fork():
        return 0
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    serve(pipe, logs)
    os._exit(0)


def serve(pipe: str, logs: str) -> None:
    os.chdir(pipe)
    with open(PIDFILE, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(float(os.environ.get("FAKE_MPS_CONTROL_START_DELAY", "0")))
    if os.path.exists(CONTROL):
        os.unlink(CONTROL)  # a dead daemon's leftover
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(CONTROL)
    srv.listen(8)
    with open(os.path.join(logs, "control.log"), "a") as f:
        f.write(f"started pid={os.getpid()} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n")
    while True:
        conn, _ = srv.accept()
        with conn, conn.makefile("rw") as f:
            for line in f:
                cmd = line.strip()
                if cmd == "quit" and os.path.exists(IGNORE_QUIT):  # as the real one while clients stay
                    f.write("\n")
                    f.flush()
                    continue
                if cmd == "quit":
                    f.write("\n")
                    f.flush()
                    os.unlink(CONTROL)
                    os.unlink(PIDFILE)
                    return
                answers = {"get_server_list": "", "get_default_active_thread_percentage": "100.0"}
                f.write(answers.get(cmd, f"unknown command {cmd}") + "\n")
                f.flush()


if __name__ == "__main__":
    sys.exit(daemonize() if sys.argv[1:] == ["-d"] else client())
