"""Elastic rollout workers for GRPO (example 02's --role trainer / rollout): the rollout service over
real HTTP on loopback, and TRL's real GRPOTrainer fed by real rollout-worker processes while the
rollout world changes 1 → 3 (two join mid-run and pull the weights) → 2 (one SIGKILLed while it
holds a lease) → 1 (one leaves on SIGTERM): no prompt lost or counted twice, and the trained weights bit-identical
to a run with one constant worker (per-prompt seeds, a batch-invariant generation path)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from rose_sdk.rollout_service import RolloutClient, RolloutError, RolloutService

REPO = Path(__file__).resolve().parents[3]
WORKLOAD = REPO / "tests" / "support" / "trl_workload.py"
TRAIN = REPO / "examples" / "02_grpo_tiny_llm" / "train.py"
TOKEN = "test-token-0123456789abcdef"
STEPS = 4
COMPLETIONS_PER_STEP = 8  # tiny_grpo: per_device_train_batch_size 8, num_generations 4


# ---------------------------------------------------------------------------------- the service


@pytest.fixture
def service() -> Iterator[RolloutService]:
    with RolloutService(token=TOKEN, lease_s=30, max_body_bytes=4096, max_connections=3) as svc:
        yield svc


def test_weights_are_pulled_versioned_and_prompts_leased_with_their_seeds(service: RolloutService) -> None:
    c = RolloutClient(service.address, worker="w0", token=TOKEN)
    assert c.version() is None
    with pytest.raises(RolloutError, match="404: no weights published yet"):
        c.weights()
    service.publish_weights(3, b"weights-v3")
    assert c.weights() == (3, b"weights-v3")
    v = service.submit_round([("a", "12"), ("b", "34")])
    reply = c.lease(5, wait_s=0)
    assert reply.version == 3 and [p.id for p in reply.prompts] == ["a", "b"] and not reply.done
    from rose_sdk.rollout_queue import prompt_seed

    assert [p.seed for p in reply.prompts] == [prompt_seed(0, "a", 3), prompt_seed(0, "b", 3)]
    assert c.complete(3, [("a", [5, 1], "x")]) == {"accepted": 1, "duplicate": 0, "stale": 0}
    assert c.complete(3, [("a", [5, 1], "x"), ("b", [6], "y")]) == {"accepted": 1, "duplicate": 1, "stale": 0}
    got = service.wait_round(v, timeout=5)
    assert got["a"].token_ids == (5, 1) and got["b"].worker == "w0"
    assert 'rose_rollout_prompts_total{outcome="duplicate"} 1' in c.metrics()
    assert "rose_rollout_weight_pulls_total 1" in c.metrics()
    with pytest.raises(RolloutError, match="must increase"):
        service.publish_weights(3, b"")
    service.finish()
    assert c.lease(1, wait_s=5).done
    c.close()


def test_a_closed_connection_returns_its_leases_and_release_too(service: RolloutService) -> None:
    service.publish_weights(0, b"w")
    v = service.submit_round([(str(i), "1") for i in range(4)])
    a = RolloutClient(service.address, worker="a", token=TOKEN)
    b = RolloutClient(service.address, worker="b", token=TOKEN)
    assert len(a.lease(2, wait_s=0).prompts) == 2
    assert len(b.lease(2, wait_s=0).prompts) == 2
    a.close()  # the worker died: its connection closed
    end = time.monotonic() + 10
    while service.status()["leased"].get("a") and time.monotonic() < end:
        time.sleep(0.01)
    assert service.status()["leased"] == {"b": 2}
    assert b.release() == 2
    c = RolloutClient(service.address, worker="c", token=TOKEN)
    got = c.lease(10, wait_s=0).prompts
    assert sorted(p.id for p in got) == ["0", "1", "2", "3"]
    c.complete(v, [(p.id, [1], "") for p in got])
    assert len(service.wait_round(v, timeout=5)) == 4
    cnt = service.queue.counters
    assert (cnt.requeued_disconnect, cnt.requeued_release, cnt.accepted) == (2, 2, 4)
    b.close()
    c.close()


def test_token_body_and_connection_bounds(service: RolloutService) -> None:
    wrong = RolloutClient(service.address, worker="x", token="wrong-token-0123456789")
    with pytest.raises(RolloutError, match="401: missing or wrong rollout token"):
        wrong.version()
    wrong.close()
    with pytest.raises(RolloutError, match="at least 16 characters"):
        RolloutService(token="short")
    host, port = service.address.split(":")
    with socket.create_connection((host, int(port))) as s:  # a body above max_body_bytes
        s.sendall(
            f"POST /v1/complete HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 99999\r\n\r\n".encode()
        )
        assert s.recv(100).startswith(b"HTTP/1.1 413")
    c = RolloutClient(service.address, worker="w", token=TOKEN)
    with pytest.raises(RolloutError, match="400: the request needs 'worker'"):
        c._request("POST", "/v1/lease", {"max": 1})
    c.close()
    time.sleep(0.2)  # the server notices the closes
    held = [socket.create_connection((host, int(port))) for _ in range(3)]  # max_connections=3
    try:
        time.sleep(0.2)
        with socket.create_connection((host, int(port))) as s:
            assert s.recv(100).startswith(b"HTTP/1.1 503")
    finally:
        for s in held:
            s.close()
    assert service.stats.refused_busy >= 1 and service.stats.refused_auth == 1
    with pytest.raises(RolloutError, match="host:port"):
        RolloutClient("nohost", worker="w", token=TOKEN)


# ---------------------------------------------------------------------------------- elastic GRPO


def _env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_")}
    return {**clean, "PYTHONPATH": str(REPO), "ROSE_ROLLOUT_TOKEN": TOKEN, "TRL_EXPERIMENTAL_SILENCE": "1", **extra}


def _trainer(tmp: Path, name: str, extra: list[str]) -> subprocess.Popen[str]:
    args = [
        "--out",
        str(tmp / f"{name}.pt"),
        "--max-steps",
        str(STEPS),
        "--beta",
        "0",
        "--num-iterations",
        "1",
        "--rollout-service",
        *extra,
    ]
    return subprocess.Popen(
        [sys.executable, str(WORKLOAD), *args], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _await(p: subprocess.Popen[str], prefix: str, seen: list[str]) -> str:
    out: IO[str] | None = p.stdout
    assert out is not None
    for line in out:
        seen.append(line)
        if line.startswith(prefix):
            return line
    raise AssertionError(f"the trainer exited before {prefix!r}: rc={p.wait()}; {''.join(seen)[-3000:]}")


def _worker(addr: str, name: str) -> subprocess.Popen[str]:
    args = ["--role", "rollout", "--batch", "1", "--trainer-wait-s", "60"]
    return subprocess.Popen(
        [sys.executable, str(TRAIN), *args],
        env=_env(ROSE_TRAINER_ADDR=addr, ROSE_POD_NAME=name),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for(cond: Any, what: str, timeout: float = 90.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def _kill_one_holding_a_lease(
    client: RolloutClient, workers: dict[str, subprocess.Popen[str]], version: int
) -> str | None:
    """Once round ``version`` is out, SIGSTOP the workers that hold leases; SIGKILL one that still
    holds one once stopped (so its lease can only come back through its closed connection);
    SIGCONT the others. None if the round ended first."""
    _wait_for(lambda: client.status()["version"] == version, f"round {version}")
    while True:
        st = client.status()
        if not st["outstanding"]:
            return None
        holders = [w for w, n in st["leased"].items() if n and w in workers]
        if not holders:
            time.sleep(0.002)
            continue
        for w in holders:
            workers[w].send_signal(signal.SIGSTOP)
        still = [w for w, n in client.status()["leased"].items() if n and w in holders]
        victim = still[0] if still else None
        for w in holders:
            if w == victim:
                workers[w].kill()
            workers[w].send_signal(signal.SIGCONT)
        if victim is not None:
            _reap(workers.pop(victim))
            return victim


def _reap(p: subprocess.Popen[str]) -> str:
    if p.poll() is None:
        p.kill()
    out = p.communicate(timeout=30)[0]
    return out or ""


def _load(path: Path) -> dict[str, Any]:
    import torch

    return dict(torch.load(path, weights_only=False))


@pytest.mark.slow
def test_world_changes_lose_nothing_and_train_bit_identical_weights(tmp_path: Path) -> None:
    import torch

    # the reference: one rollout worker (a thread of the trainer) for the whole run
    ref = subprocess.run(
        [
            sys.executable,
            str(WORKLOAD),
            "--out",
            str(tmp_path / "ref.pt"),
            "--max-steps",
            str(STEPS),
            "--beta",
            "0",
            "--num-iterations",
            "1",
            "--rollout-service",
            "--rollout-threads",
            "1",
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]

    # the elastic run: worker processes, 1 → 3 → 2 (one SIGKILLed holding a lease) → 1 (one leaves on SIGTERM)
    tr = _trainer(tmp_path, "elastic", ["--gate-dir", str(tmp_path), "--gates", "1,2,3"])
    seen: list[str] = []
    workers: dict[str, subprocess.Popen[str]] = {}
    killed: list[str] = []
    client: RolloutClient | None = None
    try:
        addr = _await(tr, "ROLLOUT_SERVICE ", seen).split()[1]
        client = RolloutClient(addr, worker="test", token=TOKEN)
        workers["w0"] = _worker(addr, "w0")
        _await(tr, "GATE 1", seen)
        workers["w1"], workers["w2"] = _worker(addr, "w1"), _worker(addr, "w2")
        _wait_for(lambda: {"w1", "w2"} <= set(client.status()["workers"]), "w1 and w2 to lease")
        (tmp_path / "go-1").touch()
        _await(tr, "GATE 2", seen)
        (tmp_path / "go-2").touch()  # round 3 (policy version 2) starts: kill a worker in the middle of it
        victim = _kill_one_holding_a_lease(client, workers, 2)
        killed += [victim] if victim else []
        _await(tr, "GATE 3", seen)
        leaver = sorted(workers)[0]
        workers[leaver].send_signal(signal.SIGTERM)  # a graceful leave: it releases its leases and exits
        left = workers.pop(leaver).communicate(timeout=60)[0]
        (tmp_path / "go-3").touch()
        if not killed:  # round 3 ended before the kill landed: kill in round 4
            victim = _kill_one_holding_a_lease(client, workers, 3)
            killed += [victim] if victim else []
        counters_line = _await(tr, "ROLLOUT_COUNTERS ", seen)
        assert tr.wait(timeout=120) == 0, "".join(seen)[-3000:]
        outs = {n: w.communicate(timeout=60)[0] for n, w in workers.items()}
    finally:
        if client is not None:
            client.close()
        for p in [tr, *workers.values()]:
            _reap(p)
    assert killed, "no worker was killed while holding a lease"
    st = json.loads(counters_line.split(" ", 1)[1])
    c = st["counters"]
    assert c["submitted"] == c["accepted"] == STEPS * COMPLETIONS_PER_STEP, c  # none lost
    assert c["duplicate"] == 0 and c["stale"] == 0, c  # none counted twice
    assert c["requeued_disconnect"] >= 1, c  # the killed worker's lease came back through its closed connection
    assert "samples=" in left, left[-2000:]  # the leaver exited cleanly
    for name, out in outs.items():  # the workers left at the end saw "done" and exited
        assert "samples=" in out, f"{name}: {out[-2000:]}"

    a, b = _load(tmp_path / "ref.pt"), _load(tmp_path / "elastic.pt")
    differ = [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]
    assert differ == [], differ
    assert a["losses"] == b["losses"]
    init = _init_weights()
    assert any(not torch.equal(init[k], a["model"][k]) for k in init)  # it trained


def _init_weights() -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "examples" / "02_grpo_tiny_llm"))
    import tiny_grpo

    return {k: v.clone() for k, v in tiny_grpo.model(7).state_dict().items()}


def test_a_world_change_releases_the_workers_leases(service: RolloutService) -> None:
    """The worker's world-change callback, run as the SDK runs it when the agent's WORLD command
    arrives (``Workload._world``), gives its leases back to the queue."""
    sys.path.insert(0, str(REPO / "examples" / "02_grpo_tiny_llm"))
    import tiny_grpo

    from rose_sdk.integrations.rollout import attach
    from rose_sdk.integrations.rollout_worker import RolloutWorker

    engine = tiny_grpo.engine(7)
    wl = attach(engine)  # a Workload, not started: no agent needed to run its callbacks
    with RolloutClient(service.address, worker="w", token=TOKEN) as client:
        worker = RolloutWorker(client, engine, workload=wl)
        service.publish_weights(0, b"w")
        service.submit_round([("a", "12"), ("b", "34")])
        assert len(client.lease(2, wait_s=0).prompts) == 2
        assert service.status()["leased"] == {"w": 2}
        wl._world(1, 2)
        assert service.status()["leased"] == {}
        assert worker.stats.released == 2 and service.queue.counters.requeued_release == 2
        wl._world(1, 2)  # a repeat of the same world: no callback, nothing to release
        assert worker.stats.released == 2
