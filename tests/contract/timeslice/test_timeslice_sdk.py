"""rose_sdk.timeslice against the real orchestrator over gRPC with TLS on loopback (memory store;
the explicit no-op or a reporting hand-over: no nodes here), and the acceptance test: two real CPU
RL trainings sharing one group end bit-identical to their solo runs. The clients verify the
server's certificate with the CA in ROSE_TIMESLICE_CA_FILE, as in a cluster."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rose_sdk import tensors_equal
from rose_sdk.timeslice import LeaseLostError, PhaseTooShortError, TimeSliceError, TimeSliceOrchestratorClient
from timeslice import certs
from timeslice.orchestrator import NoopOutcome, Orchestrator, Settings
from timeslice.server import Tls, grpc_server
from timeslice.store import MemoryStore

TRAINER = Path(__file__).resolve().parents[2] / "support" / "timeslice_trainer.py"


class CostlyHandover:
    """Reports a switch of 0.2 s suspend + 0.3 s restore (moves nothing: no nodes here)."""

    def switch(self, group: str, token: int, out_job: str | None, in_job: str, deadline: float) -> NoopOutcome:
        return NoopOutcome(suspend_s=0.2, restore_s=0.3)


CERTS: list[certs.CertFiles] = []


@pytest.fixture(scope="module")
def cert_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[certs.CertFiles]:
    CERTS.append(certs.generate(tmp_path_factory.mktemp("tls"), ("localhost", "127.0.0.1")))
    yield CERTS[-1]
    CERTS.clear()


@pytest.fixture(autouse=True)
def _client_ca(cert_files: certs.CertFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROSE_TIMESLICE_CA_FILE", str(cert_files.ca))  # the clients (and trainer processes)
    monkeypatch.delenv("ROSE_TIMESLICE_INSECURE", raising=False)


def _serve(handover: object | None = None, port: int = 0, ttl: float = 30.0) -> tuple[object, int]:
    orch = Orchestrator(MemoryStore(), handover, settings=Settings(lease_ttl_s=ttl))  # type: ignore[arg-type]
    return grpc_server(orch, f"127.0.0.1:{port}", 32, tls=Tls(CERTS[-1].cert, CERTS[-1].key))


@pytest.fixture
def target() -> Iterator[str]:
    server, port = _serve()
    yield f"127.0.0.1:{port}"
    server.stop(grace=None).wait()  # type: ignore[attr-defined]


def test_decorator_and_context_manager_take_turns(target: str) -> None:
    a = TimeSliceOrchestratorClient(target, "ml/a")
    b = TimeSliceOrchestratorClient(target, "ml/b")
    order: list[str] = []

    @a.on_accelerators(group_id="g")
    def phase_a(x: int) -> int:
        order.append("a")
        return x + 1

    with b.on_accelerators(group_id="g") as grant:  # b holds the group; a's phase waits for it
        t = threading.Thread(target=lambda: order.append(str(phase_a(1))))
        t.start()
        st = b.status("g")
        while not st.waiters:
            st = b.status("g")
        assert st.holder == "ml/b" and [w.job for w in st.waiters] == ["ml/a"] and order == []
    t.join(10)
    assert order == ["a", "2"] and grant.token >= 1
    assert a.grants[-1].token > grant.token  # every hand-over fences the one before
    assert {g.group for g in a.list_groups()} == {"ml/g"}  # a group's key: its namespace/name
    a.close()
    b.close()


def test_unavailable_is_retried_until_the_orchestrator_is_up(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = TimeSliceOrchestratorClient(f"127.0.0.1:{port}", "ml/a", backoff_first_s=0.02)
    started: list[object] = []
    caplog.set_level(logging.INFO, logger="rose_sdk.timeslice")

    def late_start() -> None:
        while not any("retrying" in r.message for r in caplog.records):
            threading.Event().wait(0.01)
        started.append(_serve(port=port)[0])

    t = threading.Thread(target=late_start)
    t.start()
    grant = client.acquire("g", timeout_s=60)
    t.join(10)
    assert grant.token == 1 and started
    client.release()
    client.close()
    started[0].stop(grace=None).wait()  # type: ignore[attr-defined]


def test_phase_too_short_for_its_switch_says_both_numbers() -> None:
    server, port = _serve(CostlyHandover())
    a = TimeSliceOrchestratorClient(f"127.0.0.1:{port}", "ml/a")
    b = TimeSliceOrchestratorClient(f"127.0.0.1:{port}", "ml/b")
    for c in (a, b):
        with c.on_accelerators(group_id="g"):
            pass
    with pytest.raises(PhaseTooShortError, match=r"last 0\.0\d\ds but a switch costs 0\.500s") as e:
        b.acquire("g")
    assert "min_phase_ratio=0" in str(e.value)
    b.min_phase_ratio = 0  # the caller's choice: switch anyway
    b.acquire("g")
    b.release()
    with pytest.raises(ValueError, match="does not hold it"):
        b.release("g")
    server.stop(grace=None).wait()  # type: ignore[attr-defined]


def test_stale_token_after_the_group_moved_on_is_reported() -> None:
    server, port = _serve(ttl=0.3)
    a = TimeSliceOrchestratorClient(f"127.0.0.1:{port}", "ml/a")
    b = TimeSliceOrchestratorClient(f"127.0.0.1:{port}", "ml/b")
    a.acquire("g")
    for h in a._held.values():  # a stops renewing (as a hung holder would)
        h.stop.set()
    b.acquire("g", timeout_s=30)  # granted once a's lease expired
    with pytest.raises(LeaseLostError, match="refused by the orchestrator"):
        a.release("g")
    b.release()
    server.stop(grace=None).wait()  # type: ignore[attr-defined]


def _train(tmp: Path, name: str, seed: int, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, str(TRAINER), "--out", str(tmp / f"{name}.pt"), "--seed", str(seed), "--updates", "10"]
    return subprocess.Popen([*cmd, *extra])


def test_two_trainings_sharing_a_group_end_bit_identical_to_their_solo_runs(tmp_path: Path, target: str) -> None:
    gate = TimeSliceOrchestratorClient(target, "ml/gate")
    gate.acquire("g")  # both trainings queue behind it, so their phases interleave from the start
    solo = [_train(tmp_path, f"solo{i}", i) for i in (1, 2)]
    shared = [_train(tmp_path, f"shared{i}", i, "--target", target, "--job", f"ml/j{i}", "--clobber") for i in (1, 2)]
    while len(gate.status("g").waiters) < 2:
        assert all(p.poll() is None for p in shared), "a shared training exited before it queued"
        threading.Event().wait(0.05)
    gate.release()
    for p in solo + shared:
        assert p.wait(300) == 0
    gate.close()
    for i in (1, 2):
        s = torch.load(tmp_path / f"solo{i}.pt", weights_only=False)
        t = torch.load(tmp_path / f"shared{i}.pt", weights_only=False)
        assert t["switched"] > 1  # the group really went back and forth
        for key in ("policy", "opt", "replay", "torch_rng", "env_rng"):
            assert tensors_equal({key: s[key]}, {key: t[key]}), f"job {i}: {key} differs from its solo run"
    one, two = (torch.load(tmp_path / f"solo{i}.pt", weights_only=False)["policy"] for i in (1, 2))
    assert not tensors_equal(one, two)  # the comparison can tell runs apart


def test_the_client_sends_its_serviceaccount_token(tmp_path: Path) -> None:
    """With authentication on, the client's token file is its identity (re-read at every call).

    The TokenReview is an explicit table here (the real one is in tests/e2e/timeslice/test_timeslice_e2e.py);
    what is checked is that the SDK sends ``authorization: Bearer`` from ROSE_TIMESLICE_TOKEN_FILE."""
    from timeslice.identity import ReviewCache, Unauthenticated

    def review(token: str) -> str:
        users = {"tok-ml": "system:serviceaccount:ml:trainer"}
        if token not in users:
            raise Unauthenticated("token refused")
        return users[token]

    orch = Orchestrator(MemoryStore(), None, settings=Settings(lease_ttl_s=30.0))
    server, port = grpc_server(
        orch, "127.0.0.1:0", 8, auth=ReviewCache(review, lambda: 0.0, ttl_s=0.0), tls=Tls(CERTS[-1].cert, CERTS[-1].key)
    )
    token, target = tmp_path / "token", f"127.0.0.1:{port}"
    clients: list[TimeSliceOrchestratorClient] = []

    def client(job: str, token_file: str) -> TimeSliceOrchestratorClient:
        c = TimeSliceOrchestratorClient(target, job, token_file=token_file, retry_timeout_s=5, min_phase_ratio=0)
        clients.append(c)  # min_phase_ratio 0: these phases are empty on purpose
        return c

    try:
        with pytest.raises(TimeSliceError, match="UNAUTHENTICATED"):
            client("ml/a", "").acquire("g", timeout_s=10)
        token.write_text("tok-ml\n")
        mine = client("ml/a", str(token))
        assert mine.acquire("g", timeout_s=10).token >= 1
        mine.release("g")
        token.write_text("rotated-but-unknown")  # re-read at every call: the new token is what is sent
        with pytest.raises(TimeSliceError, match="UNAUTHENTICATED"):
            mine.acquire("g", timeout_s=10)
        with pytest.raises(TimeSliceError, match="cannot read the ServiceAccount token"):
            client("other/a", str(tmp_path / "none")).acquire("g", timeout_s=10)
    finally:
        for c in clients:
            c.close()
        server.stop(grace=None).wait()  # type: ignore[attr-defined]
