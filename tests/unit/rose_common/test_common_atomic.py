"""rose_common.atomic: replace a file so that a crash leaves the old or the new content, never a mix."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rose_common.atomic import atomic_write


def test_creates_directory_and_file_with_mode(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "state.json"
    atomic_write(target, b"one")
    assert target.read_bytes() == b"one"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    old_umask = os.umask(0o022)
    try:
        atomic_write(target, b"two", mode=0o666)
    finally:
        os.umask(old_umask)
    assert target.read_bytes() == b"two" and stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.json"], "no temp file left behind"


def test_rename_replaces_the_inode_and_hook_sees_both_checkpoints(tmp_path: Path) -> None:
    target = tmp_path / "f"
    atomic_write(target, b"old")
    inode = target.stat().st_ino
    seen: list[tuple[str, bytes, list[str]]] = []

    def hook(point: str) -> None:
        seen.append((point, target.read_bytes(), sorted(p.name for p in tmp_path.iterdir())))

    atomic_write(target, b"new" * 1000, hook=hook)
    assert [s[0] for s in seen] == ["temp-written", "renamed"]
    # at "temp-written" the target still holds the old bytes and the full new content sits in a temp file
    assert seen[0][1] == b"old" and len(seen[0][2]) == 2
    assert seen[1][1] == b"new" * 1000 and seen[1][2] == ["f"]
    assert target.stat().st_ino != inode, "written through a new file and a rename, not in place"


def test_failure_before_rename_keeps_old_content_and_removes_temp(tmp_path: Path) -> None:
    target = tmp_path / "f"
    atomic_write(target, b"old")

    def crash(point: str) -> None:
        if point == "temp-written":
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        atomic_write(target, b"new", hook=crash)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]
