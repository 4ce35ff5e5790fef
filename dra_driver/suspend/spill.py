"""The disk tier of suspended state: when the host-memory (DRAM) budget is full, the state of the
least recently suspended workloads spills to a local directory, checksummed, and comes back on
resume. See README.md in this folder, *Layered memory*.

* :func:`plan_spill` (pure) picks which DRAM-resident states to spill for ``need`` more bytes:
  least recently suspended first, only while the disk tier's budget holds them; ``None`` when
  both tiers together cannot hold it (then the checkpoint-and-evict fallback runs).
* :class:`SpillStore` is the disk tier: one file per workload, ``<dir>/<key>.spill``, written as
  chunks each with its own blake2b-256 digest, to ``<key>.spill.tmp``, fsynced, renamed, the
  directory fsynced, its pages dropped from the page cache (``posix_fadvise(DONTNEED)``: the
  read-back then checks the disk, and spilled state does not stay in DRAM as cache), then read
  back and verified. Only then may the caller drop the DRAM copy
  (:meth:`SpillStore.spill` does it in that order), so a crash at any point leaves at least one
  complete copy: :meth:`SpillStore.recover` removes partial files and, where the DRAM copy still
  exists, the disk copy (the spill never finished; DRAM is what is accounted).
* A cooperative workload in its own container writes its spill file through its claim's spill
  directory, ``<dir>/claims/<claimUID>/`` (:meth:`SpillStore.open_claim` at prepare; the claim's
  CDI spec mounts it at :func:`container_spill_dir`); the driver still creates, names and verifies
  every file there. :func:`pick_view` (pure) picks the path under which the workload's process
  sees the file (the kernel's ``/proc/<pid>/root``); :meth:`SpillStore.close_claim` removes the
  directory at unprepare, never while it holds a verified spill. Workloads of no prepared claim
  (host processes) keep the flat layout; :meth:`SpillStore.recover` reads both.
* A full disk (the budget, or a real ``ENOSPC`` from the file system) is :class:`SpillFull`: the
  temporary file is removed, the DRAM copy is untouched, the caller falls back.
* A read whose chunk fails its digest (or is short) is :class:`SpillCorrupt`: corrupt state is
  never handed back; the caller falls back to the durable checkpoint.

Crash points (``ROSE_DRIVER_CRASH_AT``, :data:`SPILL_CRASH_POINTS`): after the first chunk is
written, after the fsync, after the rename, after the verification, after the DRAM copy is dropped.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from dra_driver.checkpoint import crash_point
from rose_common import spillfmt

SPILL_CRASH_POINTS: Final = (
    "spill-chunk-written",
    "spill-fsynced",
    "spill-renamed",
    "spill-verified",
    "spill-dram-dropped",
)

TIER_DRAM: Final = "dram"
TIER_DISK: Final = "disk"
TIERS: Final = (TIER_DRAM, TIER_DISK)

# The file format is rose_common.spillfmt (the SDK writes it too, when a cooperative workload spills).
DEFAULT_CHUNK_BYTES: Final = spillfmt.DEFAULT_CHUNK_BYTES
MAGIC: Final = spillfmt.MAGIC
_KEY_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
SUFFIX: Final = ".spill"
TMP_SUFFIX: Final = ".spill.tmp"
CLAIMS_DIR: Final = "claims"  # <dir>/claims/<claimUID>/: a claim's own spill directory
CONTAINER_SPILL_ROOT: Final = "/run/rose/spill"  # where a claim's CDI spec mounts it: <root>/<claimUID>
ENV_SPILL_DIR: Final = "ROSE_SPILL_DIR"  # the claim's spill directory as its containers see it
CLAIM_DIR_MODE: Final = 0o711  # root's; others may only traverse to the file handed to them


def container_spill_dir(claim_uid: str) -> str:
    """Pure: the claim's spill directory as the claim's containers see it (its CDI mount)."""
    return f"{CONTAINER_SPILL_ROOT}/{check_key(claim_uid)}"


def workload_views(host_path: Path, root: Path) -> list[str]:
    """Pure: the paths under which a workload may see the spill file ``host_path``, most likely
    first: inside its claim's spill directory, the container path (its CDI mount) then the host
    path; in the flat root, the host path only."""
    if host_path.parent.parent == root / CLAIMS_DIR:
        return [f"{container_spill_dir(host_path.parent.name)}/{host_path.name}", str(host_path)]
    return [str(host_path)]


def pick_view(views: Sequence[str], target: tuple[int, int], seen: Sequence[tuple[int, int] | None]) -> str | None:
    """Pure: the first of ``views`` (paths of the spill file) whose directory, seen from the
    workload's root, is the spill file's directory (``target``: its device and inode); ``seen[i]``
    is what ``views[i]``'s directory is from there (None: it cannot be looked at). When nothing
    could be looked at, the first view (a CDI-prepared claim's container path); None when every
    view was looked at and none is the directory: the workload cannot reach the file."""
    if len(views) != len(seen):
        raise ValueError(f"{len(views)} views but {len(seen)} observations")
    for v, s in zip(views, seen, strict=True):
        if s == target:
            return v
    if views and all(s is None for s in seen):
        return views[0]
    return None


NOT_THERE: Final = (-1, -1)  # pick_view's observation of a path that does not exist there


class SpillError(RuntimeError):
    """The disk tier could not store or return a workload's state."""


class SpillFull(SpillError):
    """The disk tier cannot hold it: its budget, or the file system is full (ENOSPC)."""


class SpillCorrupt(SpillError):
    """A spilled copy fails its checksum or is truncated: it must never be resumed."""


class HostCopy(Protocol):
    """The DRAM copy of suspended state, where a backend can hand it over (the I/O boundary)."""

    def host_bytes(self, key: str) -> int | None:
        """Bytes of the DRAM copy of ``key``; None when there is none."""
        ...

    def read_host(self, key: str, chunk_bytes: int) -> Iterator[bytes | memoryview]:
        """The DRAM copy, in chunks of at most ``chunk_bytes`` (views are fine: only read)."""
        ...

    def drop_host(self, key: str) -> None:
        """Free the DRAM copy (atomic: after it, there is none)."""
        ...

    def refill_host(self, key: str, chunks: Iterable[bytes]) -> int:
        """Put the state back into DRAM from ``chunks``; atomic: an exception from ``chunks``
        leaves no DRAM copy. Returns the bytes written."""
        ...


def _drop_cached(p: Path) -> None:
    """Ask the kernel to drop ``p``'s clean pages from the page cache (after its fsync)."""
    fadvise = getattr(os, "posix_fadvise", None)
    if fadvise is None:
        return
    fd = os.open(p, os.O_RDONLY)
    try:
        fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Resident:
    """A suspended state held in DRAM that the disk tier could take."""

    key: str
    nbytes: int
    suspended_seq: int  # larger = suspended later


@dataclass(frozen=True)
class HandOver:
    """A spill file the driver created for a cooperative workload to write (``SpillStore.hand_over``)."""

    key: str
    path: Path
    dev: int
    ino: int


def plan_spill(
    resident: Sequence[Resident], need: int, dram_capacity: int, dram_held: int, disk_free: int
) -> list[str] | None:
    """Pure: which DRAM-resident states to spill so ``need`` more bytes fit in DRAM — least
    recently suspended first, as few as that order allows. ``[]`` when it fits already; ``None``
    when it cannot (``need`` is larger than the DRAM budget itself, or the states to spill do not
    fit the disk tier's free bytes): then both tiers are full and the fallback runs."""
    if need < 0:
        raise ValueError(f"need must be >= 0 bytes, got {need}")
    if dram_held + need <= dram_capacity:
        return []
    if need > dram_capacity:
        return None
    out: list[str] = []
    freed = spilled = 0
    for r in sorted(resident, key=lambda r: r.suspended_seq):
        if spilled + r.nbytes > disk_free:
            return None  # least recently suspended first: skipping one for a younger one breaks the order
        out.append(r.key)
        freed += r.nbytes
        spilled += r.nbytes
        if dram_held - freed + need <= dram_capacity:
            return out
    return None


def check_key(key: str) -> str:
    if not _KEY_RE.match(key):
        raise ValueError(f"spill key {key!r} must be letters, digits, '.', '_' or '-' (at most 253)")
    return key


def _real_dir(p: Path) -> bool:
    """A directory itself, not a symlink to one (the claims' directories are never followed)."""
    try:
        return stat.S_ISDIR(os.lstat(p).st_mode)
    except OSError:
        return False


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SpillStore:
    """The disk tier: a directory, a byte budget, one checksummed file per key. Thread-safe ledger;
    callers serialise operations on one key (the engine's per-workload lock)."""

    def __init__(self, root: Path | str, capacity_bytes: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"spill budget must be >= 0 bytes, got {capacity_bytes}")
        spillfmt.check_chunk_bytes(chunk_bytes)
        self.root = Path(root)
        if not self.root.is_absolute():
            raise ValueError(f"spill directory must be an absolute path, got {str(root)!r}")
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.capacity_bytes = capacity_bytes
        self.chunk_bytes = chunk_bytes
        self._held: dict[str, int] = {}
        self._dirs: dict[str, Path] = {}  # keys whose file is in a claim's directory, not the root
        self._closed: set[str] = set()  # claims unprepared while their directory held a spill
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ ledger

    def held_bytes(self, key: str | None = None) -> int:
        with self._lock:
            return self._held.get(key, 0) if key is not None else sum(self._held.values())

    def free_bytes(self) -> int:
        return max(0, self.capacity_bytes - self.held_bytes())

    def has(self, key: str) -> bool:
        with self._lock:
            return key in self._held

    def _reserve(self, key: str, nbytes: int) -> bool:
        with self._lock:
            others = sum(v for k, v in self._held.items() if k != key)
            if others + nbytes > self.capacity_bytes:
                return False
            self._held[key] = nbytes
            return True

    def _release(self, key: str) -> None:
        with self._lock:
            self._held.pop(key, None)
            d = self._dirs.pop(key, None)
        if d is not None:
            self._rmdir_if_closed(d)

    def path(self, key: str) -> Path:
        with self._lock:
            d = self._dirs.get(key, self.root)
        return d / (check_key(key) + SUFFIX)

    # ------------------------------------------------------------------ a claim's own directory

    def claim_dir(self, claim_uid: str) -> Path:
        return self.root / CLAIMS_DIR / check_key(claim_uid)

    def open_claim(self, claim_uid: str) -> Path:
        """Create the claim's spill directory (idempotent; at prepare): owned by the driver, 0711,
        so only the driver creates, renames or removes files there and a workload can only open
        the file handed over to its own uid. Returns its host path (the CDI spec mounts it)."""
        d = self.claim_dir(claim_uid)
        d.parent.mkdir(mode=0o711, exist_ok=True)
        if not _real_dir(d.parent):
            raise SpillError(f"{d.parent} is not a directory of the driver's")
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=CLAIM_DIR_MODE)
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise SpillError(f"{d} is not a directory of the driver's (uid {os.geteuid()})")
        os.chmod(d, CLAIM_DIR_MODE)  # whatever the umask or an earlier run left
        with self._lock:
            self._closed.discard(claim_uid)
        return d

    def close_claim(self, claim_uid: str) -> bool:
        """At unprepare: remove the claim's directory and any unfinished hand-over in it, unless
        it holds a verified spill (RL state is never dropped here: the directory then goes when
        the last one is restored or removed). True when it is gone."""
        d = self.claim_dir(claim_uid)
        if d.is_symlink():  # not one of ours (only root writes here): the link goes, never its target
            d.unlink()
            return True
        if not _real_dir(d):
            return not d.exists()
        names_ = os.listdir(d)
        if any(n.endswith(SUFFIX) for n in names_):
            with self._lock:
                self._closed.add(claim_uid)
            return False
        for n in names_:
            with contextlib.suppress(OSError):
                (d / n).unlink()
        try:
            d.rmdir()
        except OSError:
            with self._lock:
                self._closed.add(claim_uid)
            return False
        return True

    def claims(self) -> list[str]:
        """Claim UIDs with a spill directory here."""
        with contextlib.suppress(FileNotFoundError):
            return sorted(p.name for p in (self.root / CLAIMS_DIR).iterdir() if _real_dir(p))
        return []

    def _rmdir_if_closed(self, d: Path) -> None:
        if d.parent != self.root / CLAIMS_DIR:
            return
        with self._lock:
            if d.name not in self._closed:
                return
        if self.close_claim(d.name):
            with self._lock:
                self._closed.discard(d.name)

    # ------------------------------------------------------------------ write

    def write(self, key: str, chunks: Iterable[bytes | memoryview], account_bytes: int) -> int:
        """Store ``chunks`` under ``key``: temp file, fsync, rename, directory fsync, verify.
        ``account_bytes`` is what the disk budget is charged (at least the payload). Raises
        SpillFull (budget or ENOSPC; nothing left behind), SpillCorrupt (the read-back differs),
        SpillError (another I/O error). Returns the payload bytes."""
        final = self.path(key)
        tmp = final.with_name(final.name[: -len(SUFFIX)] + TMP_SUFFIX)
        if not self._reserve(key, account_bytes):
            raise SpillFull(
                f"spill budget full: {account_bytes} B do not fit ({self.held_bytes()} of {self.capacity_bytes} B held)"
            )
        try:
            total = self._write_tmp(tmp, chunks)
            crash_point("spill-fsynced")
            os.replace(tmp, final)
            _fsync_dir(self.root)
            crash_point("spill-renamed")
            _drop_cached(final)  # the read-back checks what the disk holds, not the page cache
            got = sum(len(c) for c in self._read(final))
            if got != total:
                raise SpillCorrupt(f"spill of {key!r} read back {got} B, wrote {total} B")
            _drop_cached(final)  # spilled state must not stay in host memory as page cache
            crash_point("spill-verified")
        except OSError as e:
            self._abort(key, tmp, final)
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise SpillFull(f"spill directory {self.root} is full: {e.strerror}") from None
            raise SpillError(f"spill of {key!r} failed: {e!r}") from None
        except BaseException:  # SpillCorrupt, or anything else: nothing half-written stays
            self._abort(key, tmp, final)
            raise
        if total > account_bytes:
            with self._lock:  # never under-count what is on disk (even past the budget: it is there)
                self._held[key] = total
        return total

    def _write_tmp(self, tmp: Path, chunks: Iterable[bytes | memoryview]) -> int:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb", buffering=1 << 20, closefd=False) as f:
                total = spillfmt.write_chunks(
                    f, chunks, self.chunk_bytes, after_first=lambda: crash_point("spill-chunk-written")
                )
            os.fsync(fd)
        finally:
            os.close(fd)
        return total

    def _abort(self, key: str, tmp: Path, final: Path) -> None:
        for p in (tmp, final):
            with contextlib.suppress(OSError):  # else recover() removes it on the next start
                p.unlink(missing_ok=True)
        self._release(key)

    # ------------------------------------------------------------------ read

    def read(self, key: str) -> Iterator[bytes]:
        """The spilled state of ``key``, chunk by chunk, each verified before it is yielded;
        SpillCorrupt on a bad digest, a bad header or a short file."""
        p = self.path(key)
        if not p.exists():
            raise SpillError(f"no spilled state for {key!r} in {self.root}")
        return self._read(p)

    def _read(self, p: Path) -> Iterator[bytes]:
        with open(p, "rb", buffering=0) as f:
            try:
                yield from spillfmt.read_chunks(f, p.name)
            except spillfmt.FormatCorrupt as e:
                raise SpillCorrupt(str(e)) from None

    def remove(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)
        self._release(key)  # and the claim's directory, where its claim was unprepared meanwhile

    # ------------------------------------------------------------------ a workload writes it (cooperative)

    def hand_over(self, key: str, uid: int, gid: int, claim_uid: str = "") -> HandOver:
        """Create the file a cooperative workload writes its host copy into: ``<key>.spill.tmp``
        in the disk tier (in ``claim_uid``'s spill directory where the claim has one, else in the
        root), created here (``O_EXCL``, ``O_NOFOLLOW``, 0600) and given to the workload's process
        owner (``uid``/``gid``, from its ``/proc`` entry: the kernel's word, never the
        workload's). The workload neither creates nor names the file."""
        d = self.root / CLAIMS_DIR / claim_uid if claim_uid and _KEY_RE.match(claim_uid) else self.root
        if not _real_dir(d):
            d = self.root  # the claim was prepared without a spill directory (or by an older driver)
        tmp = d / (check_key(key) + TMP_SUFFIX)
        try:
            tmp.unlink(missing_ok=True)  # a stale hand-over of an earlier, unfinished spill
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise SpillError(f"cannot create the spill file of {key!r} in {self.root}: {e.strerror}") from None
        try:
            if (uid, gid) != (os.geteuid(), os.getegid()):
                os.fchown(fd, uid, gid)
            st = os.fstat(fd)
        except OSError as e:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise SpillError(f"cannot give the spill file of {key!r} to uid {uid}: {e.strerror}") from None
        os.close(fd)
        return HandOver(key, tmp, st.st_dev, st.st_ino)

    def adopt(self, h: HandOver, expect_bytes: int, account_bytes: int) -> int:
        """The workload says it wrote ``h``: trust nothing it said. The file must still be the
        inode created by :meth:`hand_over` (a regular file, one link, no symlink in its place);
        it is fsynced, renamed to ``<key>.spill``, the directory fsynced, its pages dropped, then
        read back from disk with every chunk verified, and its payload must be ``expect_bytes``
        (what the workload moved into host memory at its suspend). Raises SpillFull (budget),
        SpillCorrupt (another file, a bad checksum, a wrong size) or SpillError (I/O); on any of
        them the file is removed and nothing is charged. Returns the payload bytes."""
        final = h.path.parent / (h.key + SUFFIX)
        if not self._reserve(h.key, max(account_bytes, expect_bytes)):
            with contextlib.suppress(OSError):
                h.path.unlink(missing_ok=True)
            raise SpillFull(
                f"spill budget full: {max(account_bytes, expect_bytes)} B do not fit"
                f" ({self.held_bytes()} of {self.capacity_bytes} B held)"
            )
        try:
            fd = os.open(h.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (h.dev, h.ino) or st.st_nlink != 1:
                    raise SpillCorrupt(f"{h.path.name} is not the file the driver handed over")
                os.fsync(fd)  # durable whatever the workload did
            finally:
                os.close(fd)
            crash_point("spill-fsynced")
            os.replace(h.path, final)
            _fsync_dir(final.parent)
            crash_point("spill-renamed")
            _drop_cached(final)
            got = sum(len(c) for c in self._read(final))
            if got != expect_bytes:
                raise SpillCorrupt(
                    f"{final.name} holds {got} B; the workload moved {expect_bytes} B into host memory at its suspend"
                )
            _drop_cached(final)
            crash_point("spill-verified")
        except OSError as e:
            self._abort(h.key, h.path, final)
            raise SpillError(f"verifying the spill of {h.key!r} failed: {e.strerror or e!r}") from None
        except BaseException:
            self._abort(h.key, h.path, final)
            raise
        if final.parent != self.root:
            with self._lock:
                self._dirs[h.key] = final.parent
        return got

    def abandon(self, h: HandOver) -> None:
        """The workload did not write it (no answer, refused): remove the hand-over file."""
        with contextlib.suppress(OSError):
            h.path.unlink(missing_ok=True)

    def verify(self, key: str) -> int:
        """Read ``key``'s disk copy back, every chunk verified; its payload bytes (SpillCorrupt)."""
        return sum(len(c) for c in self.read(key))

    # ------------------------------------------------------------------ the whole move

    def spill(self, key: str, host: HostCopy, account_bytes: int) -> int:
        """Move ``key``'s DRAM copy to disk: write, fsync, rename, verify, and only then drop the
        DRAM copy. Errors as :meth:`write`; the DRAM copy is untouched unless it returns."""
        n = self.write(key, host.read_host(key, self.chunk_bytes), account_bytes)
        host.drop_host(key)
        crash_point("spill-dram-dropped")
        return n

    def restore(self, key: str, host: HostCopy) -> int:
        """Bring ``key`` back into DRAM (verified chunk by chunk; the DRAM copy is committed only
        when every chunk verified), then remove the disk copy. SpillCorrupt: the disk copy is
        removed too (it can never be resumed) and no DRAM copy exists."""
        try:
            n = host.refill_host(key, self.read(key))
        except SpillCorrupt:
            self.remove(key)
            raise
        self.remove(key)
        return n

    def recover(self, host: HostCopy | None = None) -> dict[str, int]:
        """After a restart: remove partial (temp) files; where ``host`` still has the DRAM copy of
        a key, remove its disk copy (the spill did not finish; DRAM is authoritative). Returns the
        keys held on disk with their payload bytes, now in the ledger."""
        out: dict[str, int] = {}
        dirs = [self.root, *(self.claim_dir(c) for c in self.claims())]  # the flat layout and claims'
        for d in dirs:
            for p in sorted(d.iterdir()):
                got = self._recover_file(p, host)
                if got is None:
                    continue
                out[got[0]] = got[1]
                with self._lock:
                    self._held[got[0]] = got[1]
                    if d != self.root:
                        self._dirs[got[0]] = d
            _fsync_dir(d)
        return out

    def _recover_file(self, p: Path, host: HostCopy | None) -> tuple[str, int] | None:
        name = p.name
        if name.endswith(TMP_SUFFIX):
            p.unlink(missing_ok=True)
            return None
        if not name.endswith(SUFFIX) or not p.is_file():
            return None
        key = name[: -len(SUFFIX)]
        if host is not None and host.host_bytes(key) is not None:
            p.unlink(missing_ok=True)
            return None
        with open(p, "rb") as f:
            try:
                total = spillfmt.payload_bytes(f, name)
            except spillfmt.FormatCorrupt:
                total = 0  # kept and listed: a resume reads it, fails its checksum and falls back
        return key, total


def spill_error_kind(e: SpillError) -> str:
    """Pure: the metric label of a spill error."""
    if isinstance(e, SpillFull):
        return "full"
    if isinstance(e, SpillCorrupt):
        return "corrupt"
    return "failed"
