"""Atomic file replacement: a crash at any line leaves either the old or the new content.

I/O boundary: the file system only (one temp file, one rename, two fsyncs). The steps: a temp
file in the target's directory (so the rename cannot cross file systems) → write → fsync →
rename over the target → fsync the directory (so the rename itself survives a power cut).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write", "fsync_dir"]


def fsync_dir(path: Path) -> None:
    """Make the directory entries of ``path`` (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def atomic_write(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o600,
    hook: Callable[[str], None] | None = None,
) -> None:
    """Replace ``path`` with ``data`` atomically; create its directory when missing.

    ``mode`` is the new file's permission bits (the process umask applies, as for ``open``).
    ``hook`` is called with ``"temp-written"`` (temp fsynced, not yet renamed) and ``"renamed"``
    (renamed, directory not yet fsynced): crash-test checkpoints. On an error the temp file is
    removed and the target is left as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if hook:
            hook("temp-written")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    if hook:
        hook("renamed")
    fsync_dir(path.parent)
