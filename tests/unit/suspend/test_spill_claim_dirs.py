"""A claim's own spill directory (the disk tier for a cooperative workload in its own container):
created at prepare (root's, 0711), the hand-over file inside it, the path the workload is sent
(pure ``workload_views`` / ``pick_view``, and ``CooperativeBackend.view_of`` through a process's
root), removal at unprepare only without a verified spill, and ``recover`` finding spills in both
the old flat layout and claims' directories. Real files in tmp_path; the writer is the SDK's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from dra_driver.suspend.cooperative import CooperativeBackend
from dra_driver.suspend.spill import (
    NOT_THERE,
    SpillError,
    SpillStore,
    container_spill_dir,
    pick_view,
    workload_views,
)
from rose_sdk.offload import CooperativeOffloader

UID = "0b7d6f3e-5c1a-4e8e-9a57-3f2d7c9e1a22"


def _spilled(store: SpillStore, key: str, nbytes: int, claim: str = "") -> torch.Tensor:
    """An SDK offloader writes ``nbytes`` into the file the driver hands over; the driver adopts it."""
    t = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(nbytes))
    want = t.clone()
    off = CooperativeOffloader(tensors={"t": t}, device="cpu")
    off.offload()
    h = store.hand_over(key, os.geteuid(), os.getegid(), claim)
    off.spill_to(str(h.path), chunk_bytes=4096)
    assert store.adopt(h, nbytes, nbytes) == nbytes
    return want


def test_open_claim_makes_a_drivers_0711_directory_idempotently(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 20)
    d = store.open_claim(UID)
    assert d == tmp_path / "spill" / "claims" / UID
    st = d.stat()
    assert (st.st_mode & 0o777) == 0o711 and st.st_uid == os.geteuid()
    os.chmod(d, 0o777)  # whatever an earlier run left
    assert store.open_claim(UID) == d and (d.stat().st_mode & 0o777) == 0o711
    assert store.claims() == [UID]
    with pytest.raises(ValueError, match="spill key"):
        store.open_claim("../../etc")


def test_open_claim_refuses_a_symlink_in_place_of_the_directory(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 20)
    (tmp_path / "spill" / "claims").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "spill" / "claims" / UID).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SpillError, match="is not a directory of the driver's"):
        store.open_claim(UID)


def test_hand_over_lands_in_the_claims_directory_and_stays_there(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 20)
    d = store.open_claim(UID)
    h = store.hand_over("pod-a", os.geteuid(), os.getegid(), UID)
    assert h.path == d / "pod-a.spill.tmp"
    store.abandon(h)
    _spilled(store, "pod-a", 5000, UID)
    assert store.path("pod-a") == d / "pod-a.spill" and store.path("pod-a").exists()
    assert store.verify("pod-a") == 5000
    assert not (tmp_path / "spill" / "pod-a.spill").exists()
    # a claim prepared without a directory (tier turned on later, an older driver): the flat root
    h = store.hand_over("pod-b", os.geteuid(), os.getegid(), "claim-without-dir")
    assert h.path == tmp_path / "spill" / "pod-b.spill.tmp"


def test_close_claim_never_removes_a_verified_spill(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 20)
    d = store.open_claim(UID)
    _spilled(store, "pod-a", 3000, UID)
    assert store.close_claim(UID) is False  # unprepared while its workload's state is on disk
    assert (d / "pod-a.spill").exists() and store.verify("pod-a") == 3000
    store.remove("pod-a")  # restored (or the pod forgotten): now the directory goes
    assert not d.exists() and store.claims() == []


def test_close_claim_removes_an_empty_directory_and_an_unfinished_hand_over(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 20)
    d = store.open_claim(UID)
    store.hand_over("pod-a", os.geteuid(), os.getegid(), UID)  # the workload never wrote it
    assert store.close_claim(UID) is True and not d.exists()
    assert store.close_claim(UID) is True  # already gone


def test_an_open_claim_keeps_its_directory_after_a_restore(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 20)
    d = store.open_claim(UID)
    _spilled(store, "pod-a", 2000, UID)
    store.remove("pod-a")
    assert d.is_dir()  # the claim is still prepared: its workload may spill again


def test_recover_finds_both_layouts_and_drops_partial_files(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 20)
    d = store.open_claim(UID)
    _spilled(store, "pod-old", 4000)  # the flat layout of a driver before per-claim directories
    _spilled(store, "pod-new", 6000, UID)
    (d / "pod-x.spill.tmp").write_bytes(b"half")  # a crash mid hand-over
    again = SpillStore(tmp_path / "spill", 1 << 20)  # the driver restarts
    assert again.recover() == {"pod-old": 4000, "pod-new": 6000}
    assert again.path("pod-old") == tmp_path / "spill" / "pod-old.spill"
    assert again.path("pod-new") == d / "pod-new.spill"
    assert again.verify("pod-old") == 4000 and again.verify("pod-new") == 6000
    assert not (d / "pod-x.spill.tmp").exists() and again.held_bytes() == 10_000


def test_workload_views_and_container_dir_are_pure() -> None:
    root = Path("/var/lib/rose/spill")
    f = root / "claims" / UID / "pod-a.spill.tmp"
    assert container_spill_dir(UID) == f"/run/rose/spill/{UID}"
    assert workload_views(f, root) == [f"/run/rose/spill/{UID}/pod-a.spill.tmp", str(f)]
    assert workload_views(root / "pod-a.spill.tmp", root) == [str(root / "pod-a.spill.tmp")]
    assert workload_views(root / "other" / UID / "x.spill.tmp", root) == [str(root / "other" / UID / "x.spill.tmp")]


def test_pick_view_is_the_directory_the_process_sees() -> None:
    views = ["/run/rose/spill/c/p.spill.tmp", "/var/lib/rose/spill/claims/c/p.spill.tmp"]
    target = (5, 77)
    assert pick_view(views, target, [target, NOT_THERE]) == views[0]  # in its container
    assert pick_view(views, target, [NOT_THERE, target]) == views[1]  # a host process
    assert pick_view(views, target, [(5, 78), NOT_THERE]) is None  # another directory there: never sent
    assert pick_view(views, target, [None, None]) == views[0]  # cannot look: the CDI mount
    assert pick_view(views, target, [None, NOT_THERE]) is None
    with pytest.raises(ValueError, match="2 views but 1 observations"):
        pick_view(views, target, [target])


def test_view_of_looks_through_the_processs_root(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 20)
    d = store.open_claim(UID)
    h = store.hand_over("pod-a", os.geteuid(), os.getegid(), UID)
    views = workload_views(h.path, store.root)
    # a host process (this one): only the host path is there
    assert CooperativeBackend().view_of(os.getpid(), h.path, views) == str(h.path)
    # a container's root, as /proc/<pid>/root shows it: the claim's directory at the CDI mount only
    croot = tmp_path / "croot"
    (croot / "run/rose/spill").mkdir(parents=True)
    (croot / "run/rose/spill" / UID).symlink_to(d)
    (tmp_path / "proc" / "4242").mkdir(parents=True)
    (tmp_path / "proc" / "4242" / "root").symlink_to(croot)
    coop = CooperativeBackend(proc=tmp_path / "proc")
    assert coop.view_of(4242, h.path, views) == f"/run/rose/spill/{UID}/pod-a.spill.tmp"
    (croot / "run/rose/spill" / UID).unlink()
    (croot / "run/rose/spill" / UID).mkdir()  # something else at the mount point
    assert coop.view_of(4242, h.path, views) is None
    assert coop.view_of(None, h.path, views) == views[0]  # no process to look at: the CDI mount


def test_a_symlink_in_place_of_a_claims_directory_is_never_followed(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 20)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.spill.tmp").write_bytes(b"not the driver's")
    (tmp_path / "spill" / "claims").mkdir()
    (tmp_path / "spill" / "claims" / UID).symlink_to(elsewhere)
    h = store.hand_over("pod-a", os.geteuid(), os.getegid(), UID)
    assert h.path.parent == tmp_path / "spill"  # the flat root, not the link's target
    store.abandon(h)
    assert store.claims() == [] and store.recover() == {}
    assert store.close_claim(UID) is True  # the link goes
    assert not (tmp_path / "spill" / "claims" / UID).exists()
    assert (elsewhere / "keep.spill.tmp").read_bytes() == b"not the driver's"
