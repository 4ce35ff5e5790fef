"""The ``rose`` top-level error handler: any exception a sub-command raises becomes one line.

Pure: :func:`describe` maps an exception to the one-line message; :func:`exit_code` to the exit
status. The only I/O is in :func:`run_command`, which writes that line to stderr (and the
traceback too when ``ROSE_DEBUG`` is set).
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from collections.abc import Callable

__all__ = ["DEBUG_ENV", "describe", "exit_code", "run_command"]

DEBUG_ENV = "ROSE_DEBUG"

_KUBECONFIG_HINT = "pass --kubeconfig FILE with a valid kubeconfig (empty: run inside a pod with a service account)"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def describe(command: str, exc: BaseException) -> str:
    """One line saying what failed and what to do about it."""
    prefix = f"rose {command}: error:"
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return f"{prefix} address already in use: {_first_line(exc)}: choose a free port (see `rose {command} --help`)"
    if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM):
        what = exc.filename or _first_line(exc)
        return f"{prefix} permission denied: {what}: run with access to it or choose another path"
    if isinstance(exc, FileNotFoundError):
        return f"{prefix} no such file: {exc.filename or _first_line(exc)}"
    if type(exc).__name__ == "ConfigException":  # kubernetes.config: a kubeconfig that cannot be loaded
        return f"{prefix} kubeconfig: {_first_line(exc)}: {_KUBECONFIG_HINT}"
    return f"{prefix} {type(exc).__name__}: {_first_line(exc)} (set {DEBUG_ENV}=1 for the traceback)"


def exit_code(exc: BaseException) -> int:
    """130 for Ctrl-C (the shell's convention), 1 for any other failure."""
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


def run_command(command: str, body: Callable[[], int | None]) -> int:
    """``body()``'s exit status; an exception is one line on stderr and a non-zero status."""
    try:
        return int(body() or 0)
    except SystemExit:
        raise
    except KeyboardInterrupt as e:
        print(f"rose {command}: interrupted", file=sys.stderr)
        return exit_code(e)
    except Exception as e:
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        print(describe(command, e), file=sys.stderr)
        return exit_code(e)
