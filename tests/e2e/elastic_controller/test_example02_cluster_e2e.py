"""Example 02 as an ElasticRLJob on the local cluster (issue 23 §4): the real controller and
extender (the ``world`` fixture of ``test_elastic_controller_e2e.py``, forecasts from the
``static-file`` backend) create the job's pods on KWOK nodes from
``examples/02_grpo_tiny_llm/elasticrljob.yaml`` (sized small: trainer 1, rollouts 1-3, 6 steps),
and ``tests/support/example02_fixtures.ProcessKubelet`` plays the kubelet: each Running pod's command
(``train.py --role trainer`` / ``--role rollout``) runs as a local process with the pod's env,
``ROSE_TRAINER_ADDR`` rewritten to the trainer process's ``127.0.0.1`` port; each deleted pod's
process gets SIGTERM.

The forecast moves mid-run: room for the trainer and 1 rollout, then (after step 1) for 3, then
(after step 3) for 1 again — two world changes made by the controller, the leaving workers
SIGTERMed by the kubelet. The trainer's rollout service counts every prompt: none lost, none
twice; and the trained weights equal, bit for bit, those of the same job with one rollout worker
throughout. The trainer is not suspended here (no driver on KWOK nodes).

The controller runs with its reclaim taints on (the default): a pool the plan grows into is not
tainted against its own new workers (``elastic_controller.taints``, fixed after this test first
ran with them off and found it).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_cluster import ClusterHandle
from rose_sdk.rollout_service import RolloutClient
from tests.e2e.elastic_controller import test_elastic_controller_e2e as erj
from tests.support.elastic_fixtures import write_forecasts
from tests.support.example02_fixtures import TOKEN, ProcessKubelet, constant_world_run, counters
from tests.support.k8s_helpers import wait_for

REPO = Path(__file__).resolve().parents[3]
world = erj.world  # the fixture: the extender and the controller, one static forecast file
EXAMPLE = REPO / "examples" / "02_grpo_tiny_llm" / "elasticrljob.yaml"
STEPS = 6
COMPLETIONS_PER_STEP = 8  # tiny_grpo: per_device_train_batch_size 8


def _job(ns: str) -> dict[str, Any]:
    """The example, sized for the test: 6 steps, rollouts 1-3 taking one prompt per lease, no
    checkpoint path (nothing to restore from) and the requests and priority KWOK nodes take."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["metadata"]["namespace"] = ns
    spec = body["spec"]
    spec.pop("checkpointPath")
    spec["gracefulShutdownPeriod"], spec["minUsefulRunSeconds"] = 5, 60
    trainer, rollout = spec["roles"]["trainer"], spec["roles"]["rollout"]
    rollout["minWorkers"], rollout["maxWorkers"] = 1, 3
    for role in (trainer, rollout):
        pod = role["template"]["spec"]
        pod["priorityClassName"] = "rose-rl"
        pod["containers"][0].pop("resources")
    cmd = trainer["template"]["spec"]["containers"][0]["command"]
    cmd[cmd.index("--max-steps") + 1] = str(STEPS)
    rollout["template"]["spec"]["containers"][0]["command"] += ["--batch", "1"]
    return body


@pytest.mark.slow
def test_example02_runs_elastic_on_the_cluster_losing_nothing(
    cluster: ClusterHandle,
    api: Any,
    world: dict[str, Any],
    tmp_path: Path,
) -> None:
    import torch

    t0 = time.monotonic()
    ref_weights, ref_counters = constant_world_run(tmp_path, STEPS)
    t_ref = time.monotonic() - t0

    ns, quiet, busy, cap = world["ns"], world["quiet"], world["busy"], world["capacity"]
    assert cap == 4, f"the scenario is sized for 4 GPUs in a pool, got {cap}"
    job = _job(ns)
    name = job["metadata"]["name"]
    gates = tmp_path / "gates"
    gates.mkdir()
    weights = tmp_path / "elastic.pt"
    trainer_env = {"ROSE_TEST_GATE_DIR": str(gates), "ROSE_TEST_GATES": "1,3", "ROSE_TEST_WEIGHTS": str(weights)}
    three = [f"{name}-rollout-{i}" for i in range(3)]
    t1 = time.monotonic()
    worlds: list[int] = []
    write_forecasts(world["forecasts"], {quiet: float(cap - 2), busy: float(cap)})  # room: trainer + 1 rollout
    time.sleep(2.5)  # the controller and the extender re-read the file every second
    with ProcessKubelet(api, ns, name, tmp_path, trainer_env) as kubelet:
        erj._kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(job))
        tr = wait_for("the trainer process", lambda: kubelet.check() or kubelet.trainer, 90)
        tr.await_line("GATE 1", 180)
        worlds.append(len(kubelet.running("rollout")))
        assert kubelet.running("trainer") == [f"{name}-trainer-0"]

        # world change 1: serving forecast to need nothing: the controller adds two rollout workers,
        # which pull the weights and lease
        write_forecasts(world["forecasts"], {quiet: 0.0, busy: float(cap)})
        wait_for("3 rollout processes", lambda: kubelet.check() or kubelet.running("rollout") == three, 120)
        worlds.append(len(kubelet.running("rollout")))
        with RolloutClient(kubelet.trainer_addr, worker="test", token=TOKEN) as c:
            wait_for("the new workers connect", lambda: set(three) <= set(c.status()["workers"]), 120)
        (gates / "go-1").touch()
        tr.await_line("GATE 3", 180)

        # world change 2: serving forecast to need 2 of 4 again: two rollout workers removed, SIGTERMed
        write_forecasts(world["forecasts"], {quiet: float(cap - 2), busy: float(cap)})
        wait_for("2 rollouts removed", lambda: kubelet.check() or kubelet.running("rollout") == three[:1], 90)
        worlds.append(len(kubelet.running("rollout")))
        (gates / "go-3").touch()
        assert tr.proc.wait(timeout=180) == 0, "".join(tr.lines)[-3000:]
        t_run = time.monotonic() - t1
        got = counters(tr.lines)
        wait_for("the rollout workers see 'done' and exit", lambda: not kubelet.running("rollout"), 60)
        terms = [n for _, what, n in kubelet.events if what == "sigterm"]
        erj._kubectl(cluster, "delete", "elasticrljob", name, "-n", ns, "--wait=true")
        assert kubelet.errors == [], kubelet.errors

    assert worlds == [1, 3, 1], worlds
    assert sorted(terms) == [f"{name}-rollout-1", f"{name}-rollout-2"], kubelet.events
    for n in [n for _, what, n in kubelet.events if what == "start" and "-rollout-" in n]:  # each said goodbye
        assert "samples=" in (tmp_path / f"{n}.log").read_text(), (tmp_path / f"{n}.log").read_text()[-2000:]
    total = STEPS * COMPLETIONS_PER_STEP
    assert got["submitted"] == got["accepted"] == total, got  # none lost
    assert got["duplicate"] == 0 and got["stale"] == 0, got  # none counted twice
    assert ref_counters["accepted"] == total and ref_counters["duplicate"] == 0, ref_counters
    a, b = torch.load(ref_weights), torch.load(weights)
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert sorted(a) == sorted(b) and differ == [], differ
    print(f"constant-world run {t_ref:.1f} s; cluster run {t_run:.1f} s; worlds {worlds}; counters {got}")
    assert world["controller"].poll() is None, world["log"].read_text()[-2000:]
