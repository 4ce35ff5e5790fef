"""Example 02 as an ElasticRLJob on the local cluster (issue 23 §4): the real controller and
extender (the ``world`` fixture of ``tests/support/erj_cluster.py``, forecasts from the
``static-file`` backend) create the job's pods on KWOK nodes from
``examples/02_grpo_tiny_llm/elasticrljob.yaml`` (sized small: trainer 1, rollouts 1-3, 6 steps),
and ``rose_cli.example02_pods.ProcessKubelet`` plays the kubelet: each Running pod's command
(``train.py --role trainer`` / ``--role rollout``) runs as a local process with the pod's env,
``ROSE_TRAINER_ADDR`` rewritten to the trainer process's ``127.0.0.1`` port; each deleted pod's
process gets SIGTERM. A real ``rose driver`` runs on each node of the lent pool (simulated GPUs,
node suspend engine with its cooperative backend); the played kubelet prepares the trainer's claim
on it before the trainer starts, so the trainer registers on its claim's node-agent socket.

The scenario is ``rose demo``'s act 6 (``rose_cli.demo_rollouts.run_job``): the forecast moves
mid-run — room for the trainer and 1 rollout, then (after step 1) for 3, then (after step 3) for 1
again — two world changes made by the controller, the leaving workers SIGTERMed by the kubelet;
then a serving pod is prepared on the trainer's GPU, which suspends the trainer into host memory
at its safe point, and unprepared, which resumes it. The trainer's rollout service counts every
prompt: none lost, none twice; and the trained weights equal, bit for bit, those of the same job
with one rollout worker throughout, never suspended.

The controller runs with its reclaim taints on (the default): a pool the plan grows into is not
tainted against its own new workers (``elastic_controller.taints``, fixed after this test first
ran with them off and found it).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from local_cluster import ClusterHandle
from rose_cli import demo_elastic
from rose_cli.demo_rollouts import COMPLETIONS_PER_STEP, STEPS, run_job, weights_identical
from tests.support.driver_fixtures import restore_seed_slices
from tests.support.erj_cluster import world
from tests.support.example02_fixtures import TOKEN, constant_world_run

__all__ = ["world"]  # the fixture: the extender and the controller, one static forecast file


@pytest.mark.slow
def test_example02_runs_elastic_on_the_cluster_losing_nothing(
    cluster: ClusterHandle,
    api: Any,
    world: dict[str, Any],
    tmp_path: Path,
) -> None:
    t0 = time.monotonic()
    ref_weights, ref_counters = constant_world_run(tmp_path, STEPS)
    t_ref = time.monotonic() - t0

    quiet, cap = world["quiet"], world["capacity"]
    assert cap == 4, f"the scenario is sized for 4 GPUs in a pool, got {cap}"
    assert world["forecasts"] == tmp_path / "forecasts.json"  # the file the stage writes
    s = demo_elastic.Stage(
        cluster,
        api,
        print,
        tmp_path,
        ns=world["ns"],
        quiet=quiet,
        busy=world["busy"],
        capacity={quiet: cap, world["busy"]: cap},
    )
    nodes = sorted(n for n, p in cluster.pools.items() if p == quiet)
    t1 = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            demo_elastic._start_drivers(s, stack)
            o = run_job(s, tmp_path, TOKEN)
    finally:
        restore_seed_slices(cluster, api, nodes)
    t_run = time.monotonic() - t1

    name = "grpo-tiny"
    assert o.worlds == [1, 3, 1], o.worlds
    assert o.terms == [f"{name}-rollout-1", f"{name}-rollout-2"], o.terms
    for log in o.rollout_logs:  # each said goodbye
        assert "samples=" in log.read_text(), log.read_text()[-2000:]
    got = o.counters
    total = STEPS * COMPLETIONS_PER_STEP
    assert got["submitted"] == got["accepted"] == total, got  # none lost
    assert got["duplicate"] == 0 and got["stale"] == 0, got  # none counted twice
    assert got["suspends"] == got["resumes"] == 1, got  # through the real driver's node agent
    assert o.states == ["Suspended", "Running"], o.states
    assert ref_counters["accepted"] == total and ref_counters["duplicate"] == 0, ref_counters
    assert ref_counters["suspends"] == 0, ref_counters
    assert weights_identical(ref_weights, o.weights)
    print(
        f"constant-world run {t_ref:.1f} s; cluster run {t_run:.1f} s (serving prepare {o.serving_prepare_s:.2f} s);"
        f" worlds {o.worlds}; counters {got}"
    )
    assert world["controller"].poll() is None, world["log"].read_text()[-2000:]
