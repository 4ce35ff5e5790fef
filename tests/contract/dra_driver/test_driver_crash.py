"""Crash safety: kill -9 the driver at every checkpoint line and at random times, restart, retry.

Most trials run the driver's node-state machine in a subprocess (``tests/support/driver_fixtures.py
crash-child``) through scripts of prepare / unprepare / suspend-request / cancel calls; the
process dies either at a named checkpoint (``ROSE_DRIVER_CRASH_AT``, the driver's own
``os._exit`` hook) or by SIGKILL after a random delay. Then, like the kubelet, the test restarts
it and retries from the interrupted call. After every trial: the checkpoint decodes (never
corrupt), and the final outcome — prepared claims, suspensions, CDI specs and every occupant's
state, verified byte-for-byte where it lives — equals a run that never crashed: nothing lost,
nothing prepared twice, suspended state restorable. A few trials kill a full plugin process
serving the real gRPC sockets.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from dra_driver.checkpoint import crash_hits, reset_crash_hits
from dra_driver.state import CRASH_POINTS, decode
from rose_common.proto import k8s_dra_v1_pb2 as v1
from tests.support.driver_fixtures import (
    CRASH_CLAIMS,
    SCRIPTS,
    FileClaims,
    FileOccupantEngine,
    make_driver,
    observe,
    run_script_step,
)

FIXTURES = Path(__file__).resolve().parents[2] / "support" / "driver_fixtures.py"
REPO = FIXTURES.parent.parent
NAMED_TRIALS = 80  # kills at a named checkpoint line (name:N), sampled from those a clean run reaches
RANDOM_TRIALS = 22  # kills by SIGKILL after a random delay


def _setup(d: Path) -> None:
    d.mkdir(parents=True)
    (d / "claims.json").write_text(json.dumps(CRASH_CLAIMS))


def _reference(tmp: Path, script: str) -> tuple[dict[str, Any], dict[str, int]]:
    """The outcome of a run that never crashes, and how often it passes each checkpoint line."""
    d = tmp / f"ref-{script}"
    _setup(d)
    old = os.environ.get("ROSE_DRIVER_CRASH_AT")
    os.environ["ROSE_DRIVER_CRASH_AT"] = "count-only"  # counts hits, never matches a point
    reset_crash_hits()
    try:
        drv = make_driver(d, FileClaims(d / "claims.json"), FileOccupantEngine(d / "engine"))
        drv.recover()
        for step in SCRIPTS[script]:
            run_script_step(drv, *step)
        drv.close()
    finally:
        if old is None:
            del os.environ["ROSE_DRIVER_CRASH_AT"]
        else:
            os.environ["ROSE_DRIVER_CRASH_AT"] = old
    return observe(d), crash_hits()


def _env(crash_at: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ROSE_DRIVER_CRASH_AT"}
    env["PYTHONPATH"] = str(REPO)
    if crash_at:
        env["ROSE_DRIVER_CRASH_AT"] = crash_at
    return env


def _last_begun(out: str) -> int | None:
    begun = [int(line.split()[1]) for line in out.splitlines() if line.startswith("begin ")]
    return begun[-1] if begun else None


def _trial(
    tmp: Path, i: int, plan: tuple[str, str | None], rng: random.Random
) -> tuple[str, bool, dict[str, Any], str]:
    script, crash_at = plan
    d = tmp / f"t{i}"
    _setup(d)
    if crash_at is not None:  # a named checkpoint line, its N-th hit
        r = subprocess.run(
            [sys.executable, str(FIXTURES), "crash-child", str(d), script, "0"],
            env=_env(crash_at),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        out, crashed, how = r.stdout, r.returncode == 137, crash_at
        assert r.returncode in (0, 137), r.stderr[-2000:]
    else:  # SIGKILL after a random delay; if the script finished first, start over with a shorter delay
        limit = 0.08
        for _attempt in range(4):
            shutil.rmtree(d)
            _setup(d)
            delay = rng.uniform(0.0, limit)
            p = subprocess.Popen(
                [sys.executable, str(FIXTURES), "crash-child", str(d), script, "0"],
                env=_env(None),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert p.stdout is not None
            first = p.stdout.readline()  # "begin 0": recovery done, the script is running
            time.sleep(delay)
            p.send_signal(signal.SIGKILL)
            rest, err = p.communicate(timeout=60)
            assert p.returncode in (0, -signal.SIGKILL), err[-2000:]
            out, crashed, how = first + rest, p.returncode == -signal.SIGKILL, f"sigkill+{delay * 1000:.0f}ms"
            if crashed:
                break
            limit /= 2
    cp = d / "state" / "checkpoint.json"
    if cp.exists():
        decode(cp.read_bytes())  # never corrupt, whatever line the process died on
    start = _last_begun(out)
    start = 0 if start is None else start
    r2 = subprocess.run(
        [sys.executable, str(FIXTURES), "crash-child", str(d), script, str(start)],
        env=_env(None),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r2.returncode == 0, f"restart after {how} in {script} failed:\n{r2.stderr[-3000:]}"
    result = observe(d)
    shutil.rmtree(d, ignore_errors=True)
    return script, crashed, result, how


def test_randomized_kill9_trials(tmp_path: Path) -> None:
    refs, hits = {}, {}
    for s in SCRIPTS:
        refs[s], hits[s] = _reference(tmp_path, s)
    assert refs["hold"]["occupants"] == {"uid-l0": "suspended"}  # the references mean something
    assert refs["reclaim"]["occupants"] == {"uid-l0": "running"}
    rng = random.Random(20261129)
    every = [(s, f"{p}:{n}") for s in sorted(SCRIPTS) for p in CRASH_POINTS for n in range(1, hits[s].get(p, 0) + 1)]
    assert {c.split(":")[0] for _, c in every} == set(CRASH_POINTS), "a checkpoint line no script reaches"
    # every line at least once (its first hit in some script), the rest sampled at random
    firsts = {c.split(":")[0]: (s, c) for s, c in reversed(every) if c.endswith(":1")}
    rest = [x for x in every if x not in firsts.values()]
    named = list(firsts.values()) + rng.sample(rest, min(len(rest), NAMED_TRIALS - len(firsts)))
    plans: list[tuple[str, str | None]] = [*named, *((rng.choice(sorted(SCRIPTS)), None) for _ in range(RANDOM_TRIALS))]
    seeds = [rng.random() for _ in plans]
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda i: _trial(tmp_path, i, plans[i], random.Random(seeds[i])), range(len(plans))))
    mismatches = [(how, script, res, refs[script]) for script, _, res, how in results if res != refs[script]]
    assert not mismatches, f"{len(mismatches)} trials diverged; first: {mismatches[0]}"
    crashed = sum(1 for _, c, _, _ in results if c)
    points_hit = {how.split(":")[0] for _, c, _, how in results if c and not how.startswith("sigkill")}
    random_kills = sum(1 for _, c, _, how in results if c and how.startswith("sigkill"))
    print(
        f"\n{len(plans)} trials ({len(every)} possible named kills), {crashed} killed mid-run "
        f"({random_kills} by random-time SIGKILL), "
        f"{time.monotonic() - t0:.1f}s"
    )
    assert points_hit == set(CRASH_POINTS), f"checkpoint lines never hit: {set(CRASH_POINTS) - points_hit}"
    assert crashed - random_kills == len(named), "a named kill did not happen"
    assert crashed >= 100 and random_kills >= RANDOM_TRIALS - 2, (crashed, random_kills)


def _grpc_call(sock: Path, method: str, uid: str, name: str) -> Any:
    req = (v1.NodePrepareResourcesRequest if "Prep" in method else v1.NodeUnprepareResourcesRequest)()
    req.claims.add(namespace="ml", uid=uid, name=name)
    resp_t = v1.NodePrepareResourcesResponse if "Prep" in method else v1.NodeUnprepareResourcesResponse
    with grpc.insecure_channel(f"unix://{sock}") as ch:
        fn = ch.unary_unary(
            f"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/{method}",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        return resp_t.FromString(fn(req.SerializeToString(), timeout=20))


def _start_grpc_child(d: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, str(FIXTURES), "grpc-child", str(d)],
        env=_env(None),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def test_full_plugin_process_killed_mid_call(tmp_path: Path) -> None:
    ref, _ = _reference(tmp_path, "reclaim")
    calls = [
        ("NodePrepareResources", "uid-l0", "l0"),
        ("NodePrepareResources", "uid-s0", "s0"),
        ("NodeUnprepareResources", "uid-s0", "s0"),
    ]
    rng = random.Random(7)
    for trial in range(4):
        d = tmp_path / f"g{trial}"
        _setup(d)
        p = _start_grpc_child(d)
        done: list[int] = []

        def kubelet(sock: Path = d / "plug" / "dra.sock", done: list[int] = done) -> None:
            for j, (m, uid, name) in enumerate(calls):
                try:
                    resp = _grpc_call(sock, m, uid, name)
                except grpc.RpcError:
                    return
                assert resp.claims[uid].error == ""
                done.append(j)

        t = threading.Thread(target=kubelet)
        t.start()
        time.sleep(rng.uniform(0.0, 0.06))
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=30)
        t.join(timeout=30)
        decode((d / "state" / "checkpoint.json").read_bytes()) if (d / "state" / "checkpoint.json").exists() else None
        p = _start_grpc_child(d)  # restarted plugin: the kubelet retries what did not answer
        try:
            for m, uid, name in calls[len(done) :]:
                assert _grpc_call(d / "plug" / "dra.sock", m, uid, name).claims[uid].error == ""
        finally:
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=30)
        assert observe(d) == ref, f"trial {trial} (kubelet saw {len(done)} answers)"


def test_crash_point_hook_exits_on_nth_hit(tmp_path: Path) -> None:
    code = (
        "from dra_driver.checkpoint import crash_point\n"
        "for i in range(5):\n    print(i, flush=True); crash_point('prepare-started')\n"
    )
    env = {"ROSE_DRIVER_CRASH_AT": "prepare-started:3", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert r.returncode == 137 and r.stdout.split() == ["0", "1", "2"]
