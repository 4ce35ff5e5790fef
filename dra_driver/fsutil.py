"""Atomic file writes: temp file in the same directory, fsync, rename, directory fsync."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o600, hook: Callable[[str], None] | None = None) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new content.

    ``hook`` is called with ``"temp-written"`` (temp fsynced, not renamed) and ``"renamed"``
    (renamed, directory not yet fsynced): crash-test checkpoints.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    if hook:
        hook("temp-written")
    os.replace(tmp, path)
    if hook:
        hook("renamed")
    fsync_dir(path.parent)
