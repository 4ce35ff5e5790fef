"""PID resolution for cuda-checkpoint never guesses (issue 9 §2 defect 6)."""

from __future__ import annotations

from pathlib import Path

from dra_driver.suspend.pids import resolve_pid

UID = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc"


def fake_proc(root: Path, pid: int, nspid: list[int], cgroup: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "status").write_text("Name:\tpython\nNSpid:\t" + "\t".join(map(str, nspid)) + "\n")
    (d / "cgroup").write_text(cgroup)


def test_known_pod_whose_cgroup_does_not_name_it_is_refused_not_the_hosts_init(tmp_path: Path) -> None:
    """hostPID agent; the workload (its PID 1 in the container) sits in a cgroup namespace, so its
    cgroup path does not name the pod. Reported PID 1 must not resolve to the host's PID 1."""
    fake_proc(tmp_path, 1, [1], "0::/init.scope\n")  # the host's init, in the agent's namespace
    fake_proc(tmp_path, 4242, [4242, 1], "0::/\n")  # the workload: cgroupns hides the pod UID
    assert resolve_pid(UID, 1, tmp_path) is None
    fake_proc(tmp_path, 99, [99], "0::/user.slice\n")
    assert resolve_pid(UID, 99, tmp_path) is None  # a known pod never takes the reported PID as is


def test_known_pod_resolves_through_its_cgroup(tmp_path: Path) -> None:
    fake_proc(tmp_path, 1, [1], "0::/init.scope\n")
    fake_proc(tmp_path, 4242, [4242, 1], f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri\n")
    assert resolve_pid(UID, 1, tmp_path) == 4242


def test_unknown_pod_uid_only_takes_a_process_of_the_agents_namespace(tmp_path: Path) -> None:
    fake_proc(tmp_path, 99, [99], "0::/user.slice\n")
    fake_proc(tmp_path, 4242, [4242, 7], "0::/x\n")
    assert resolve_pid("", 99, tmp_path) == 99
    assert resolve_pid("", 7, tmp_path) is None
    assert resolve_pid("", 5, tmp_path) is None  # no such process


def test_unreadable_proc_is_refused(tmp_path: Path) -> None:
    assert resolve_pid(UID, 1, tmp_path / "missing") is None


def test_the_containers_first_process_is_told_from_the_pods_pause_by_its_claims_environment(tmp_path: Path) -> None:
    """Each container of a pod has its own PID namespace: the sandbox's pause and the workload are
    both PID 1 there, both in the pod's cgroup. The one the claim's CDI spec started is taken."""
    pod = f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri\n"
    fake_proc(tmp_path, 300, [300, 1], pod)  # pause: started before the workload (a lower PID)
    (tmp_path / "300" / "environ").write_bytes(b"PATH=/usr/bin\0HOSTNAME=rl-0\0")
    fake_proc(tmp_path, 4242, [4242, 1], pod)
    (tmp_path / "4242" / "environ").write_bytes(b"PATH=/usr/bin\0ROSE_CLAIM_UID_AB_CD=ab-cd\0ROSE_POD_UID=x\0")
    assert resolve_pid(UID, 1, tmp_path) == 4242
    (tmp_path / "300" / "environ").write_bytes(b"ROSE_CLAIM_UID_EF=ef\0")  # two claimed containers: which one?
    assert resolve_pid(UID, 1, tmp_path) is None
    (tmp_path / "300" / "environ").unlink()
    (tmp_path / "4242" / "environ").unlink()  # unreadable: never a guess
    assert resolve_pid(UID, 1, tmp_path) is None
