"""The one runner every component's ``cli.py`` uses: logging, kubeconfig errors, SIGTERM, threads.

    def main(argv: list[str] | None = None) -> int:
        return runner.run("rose extender", lambda: build_parser().parse_args(argv), serve)

    def serve(args: argparse.Namespace, r: runner.Runner) -> int:
        api = runner.kube_client("rose extender", args.kubeconfig, env="ROSE_EXTENDER_KUBECONFIG")
        r.on_stop(server.stop)            # called once, on SIGTERM / SIGINT or when serve returns
        r.thread(loop, "forecast-pools")  # loop(stop: threading.Event); joined with a bound at the end
        server.serve_forever()

What :func:`run` does, in order:

1. parses the flags; a flag error is one line, ``<prog>: error: ...`` (``EnvArgumentParser.error``);
2. sets up JSON logging at ``--log-level`` (when the component has that flag);
3. turns SIGTERM and SIGINT into an orderly stop: :attr:`Runner.stop` is set and the
   :meth:`Runner.on_stop` callbacks run (once, on their own thread, so a blocked main thread
   unblocks);
4. runs the component's body; a failure at start (:class:`StartError`, or ``SystemExit`` with a
   message, the components' older idiom) is one line on stderr and exit status 2;
5. at the end, whatever happened: sets the stop event, runs the ``on_stop`` callbacks not yet run,
   joins the threads started with :meth:`Runner.thread` for at most ``join_timeout_s`` in all, and
   logs ``threads left at exit`` naming any still running; restores the previous signal handlers.

I/O: signal handlers, threads, stderr. The one-line messages are made by pure functions
(:func:`kubeconfig_problem`, :func:`start_failure_line`).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from rose_common import logs

__all__ = ["Runner", "StartError", "kube_client", "kubeconfig_problem", "run", "start_failure_line"]

log = logging.getLogger("rose_common.runner")

START_FAILURE_EXIT = 2
DEBUG_ENV = "ROSE_DEBUG"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StartError(Exception):
    """A component cannot start; the message (one line) says what to fix. Exit status 2."""


def start_failure_line(prog: str, message: str) -> str:
    """``("rose x", "bad\\n detail")`` → ``"rose x: bad detail"``; a message already naming ``prog`` is kept."""
    text = " ".join(message.split())
    return text if text.startswith(f"{prog}:") or text.startswith("rose ") else f"{prog}: {text}"


def kubeconfig_problem(kubeconfig: str, env: str, exc: BaseException | None) -> str:
    """One line naming what to fix when no API client could be made from ``kubeconfig``.

    ``exc`` None: the file does not exist. An empty ``kubeconfig`` means the in-cluster service
    account was tried.
    """
    if exc is None:
        return f"--kubeconfig {kubeconfig}: no such file; give the path of a kubeconfig (or set {env})"
    where = f"--kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
    lines = str(exc).strip().splitlines()
    why = lines[0] if lines else type(exc).__name__
    return f"cannot load {where}: {why}; set --kubeconfig FILE (or {env}) to a valid kubeconfig"


def kube_client(kubeconfig: str, *, env: str, connections: int | None = None) -> Any:
    """An API client from ``kubeconfig`` (empty: the pod's service account); :class:`StartError` if none."""
    from rose_common.kube.client import api_client

    if kubeconfig and not Path(kubeconfig).is_file():
        raise StartError(kubeconfig_problem(kubeconfig, env, None))
    try:
        return api_client(Path(kubeconfig) if kubeconfig else None, connections)
    except Exception as e:  # kubernetes.config errors, an unreadable or malformed file
        raise StartError(kubeconfig_problem(kubeconfig, env, e)) from None


class Runner:
    """The stop event, the stop callbacks and the background threads of one component run."""

    def __init__(self, prog: str, join_timeout_s: float = 10.0) -> None:
        self.prog = prog
        self.stop = threading.Event()
        self.join_timeout_s = join_timeout_s
        self._threads: list[threading.Thread] = []
        self._stoppers: list[Callable[[], object]] = []
        self._lock = threading.Lock()

    def thread(self, target: Callable[[threading.Event], object], name: str) -> threading.Thread:
        """Start ``target(stop)`` on a daemon thread; it must return soon after ``stop`` is set."""
        t = threading.Thread(target=target, args=(self.stop,), name=name, daemon=True)
        self._threads.append(t)
        t.start()
        return t

    def on_stop(self, fn: Callable[[], object]) -> None:
        """Call ``fn()`` once when the component stops (a signal, or its body returning), in order."""
        with self._lock:
            self._stoppers.append(fn)

    def request_stop(self) -> None:
        """What SIGTERM / SIGINT do: set :attr:`stop` and run the stop callbacks on their own thread."""
        self.stop.set()
        t = threading.Thread(target=self._run_stoppers, name="stopping", daemon=True)
        self._threads.append(t)
        t.start()

    def _run_stoppers(self) -> None:
        while True:
            with self._lock:
                if not self._stoppers:
                    return
                fn = self._stoppers.pop(0)
            try:
                fn()
            except Exception as e:
                log.warning("stop callback failed", extra={"err": repr(e)})

    def shutdown(self) -> list[str]:
        """Stop everything; the names of the threads still running after the bound (logged)."""
        self.stop.set()
        self._run_stoppers()
        deadline = time.monotonic() + self.join_timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        left = [t.name for t in self._threads if t.is_alive()]
        if left:
            log.warning("threads left at exit", extra={"threads": left, "boundSeconds": self.join_timeout_s})
        return left


def _install(handler: Callable[[int, FrameType | None], None]) -> dict[int, Any]:
    """Install ``handler`` for SIGTERM and SIGINT (main thread only); the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}


def _failed(prog: str, message: str) -> None:
    """The one line on stderr; ``ROSE_DEBUG=1`` puts the traceback before it."""
    if os.environ.get(DEBUG_ENV):
        traceback.print_exc()
    print(start_failure_line(prog, message), file=sys.stderr)


def run(
    prog: str,
    parse: Callable[[], argparse.Namespace],
    body: Callable[[argparse.Namespace, Runner], int | None],
    *,
    logger: str = "",
    join_timeout_s: float = 10.0,
) -> int:
    """Parse, set up logging and signals, run ``body(args, runner)``, then stop; its exit status."""
    args = parse()
    if isinstance(getattr(args, "log_level", None), str):
        logs.setup(args.log_level, logger)
    r = Runner(prog, join_timeout_s)
    previous = _install(lambda signum, frame: r.request_stop())
    try:
        return int(body(args, r) or 0)
    except StartError as e:
        _failed(prog, str(e))
        return START_FAILURE_EXIT
    except SystemExit as e:
        if not isinstance(e.code, str):
            raise
        _failed(prog, e.code)
        return START_FAILURE_EXIT
    finally:
        r.shutdown()
        for sig, old in previous.items():
            signal.signal(sig, old)
