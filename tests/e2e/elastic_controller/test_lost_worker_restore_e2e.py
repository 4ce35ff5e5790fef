"""A worker lost to the driver's checkpoint-and-evict fallback is recreated by the controller and
its workload resumes from the job's S3 checkpoint, bit-exact with an uninterrupted run.

Real: the control plane, the rose-scheduler with the extender, ``python -m elastic_controller``,
MinIO (``local_cluster.s3``), the example trainer as the worker's process. The test plays the
kubelet, and says so: for each Running worker it starts the container's command with the
container's environment as the kubelet resolves it (values, downward API fields, ``envFrom`` of
the Secret holding the S3 credentials). It plays the driver's fallback too, as
``dra_driver.suspend.engine`` does it once the workload's checkpoint is written: annotate
``rose.io/suspend-state: CheckpointedEvicted``, then a policy/v1 Eviction with a UID
precondition; the kubelet (the test) kills the evicted pod's process.
"""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from kubernetes import client

from local_cluster import ClusterHandle
from local_cluster.s3 import S3Server
from rose_common import names
from tests.support.erj_cluster import JOB, job_workers, kubectl, world  # noqa: F401  # world: the fixture
from tests.support.erj_manifests import elastic_rl_job
from tests.support.example01_runs import PARK_AT, REPO, UPDATES, assert_same_run, finish, ready_step, uninterrupted
from tests.support.k8s_helpers import wait_for
from tests.support.s3_fixtures import bucket_view, s3, wait_checkpoint  # noqa: F401  # s3: the MinIO fixture

SECRET = "s3-credentials"


def _job(ns: str, url: str, out: Path) -> str:
    trainer = {"name": "trainer", "image": "rose/cartpole",
               "command": ["python", "examples/01_cartpole_reinforce.py", "--updates", str(UPDATES),
                           "--suspend-points", "1", "--out", str(out)],
               "env": [{"name": "ROSE_CHECKPOINT_EVERY", "value": str(PARK_AT)}],
               "envFrom": [{"secretRef": {"name": SECRET}}]}  # fmt: skip
    body = elastic_rl_job(
        JOB,
        ns,
        minGPUs=1,
        maxGPUs=1,
        gpusPerWorker=1,
        gracefulShutdownPeriod=5,
        minUsefulRunSeconds=60,
        suspendPolicy="CheckpointAndEvict",
        checkpointPath=url,
        template={"spec": {"containers": [trainer]}},
    )
    return json.dumps(body)


def _running_worker(api: Any, ns: str, not_uid: str = "") -> Any:
    def one() -> Any:
        pods = [p for p in job_workers(api, ns) if p.metadata.deletion_timestamp is None and p.metadata.uid != not_uid]
        return pods[0] if len(pods) == 1 and pods[0].status.phase == "Running" else None

    return wait_for("a running worker" + (" (recreated)" if not_uid else ""), one, 90)


def _kubelet_env(core: Any, pod: Any) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom Secrets, then env entries."""
    (c,) = pod.spec.containers
    env: dict[str, str] = {}
    for src in c.env_from or []:
        secret = core.read_namespaced_secret(src.secret_ref.name, pod.metadata.namespace)
        env.update({k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()})
    fields = {
        "metadata.uid": pod.metadata.uid,
        "metadata.name": pod.metadata.name,
        "metadata.namespace": pod.metadata.namespace,
    }
    for e in c.env or []:
        env[e.name] = e.value if e.value is not None else fields[e.value_from.field_ref.field_path]
    return env


def _run_container(core: Any, pod: Any) -> subprocess.Popen[str]:
    (c,) = pod.spec.containers
    argv = [sys.executable if a == "python" else a for a in [*c.command, *(c.args or [])]]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": "/tmp", **_kubelet_env(core, pod)}
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _fallback_evict(core: Any, pod: Any) -> None:
    """What the driver's checkpoint-and-evict fallback writes once the checkpoint is verified."""
    ns, name, uid = pod.metadata.namespace, pod.metadata.name, pod.metadata.uid
    state = {"metadata": {"annotations": {names.ANNOTATION_SUSPEND_STATE: "CheckpointedEvicted"}}}
    core.patch_namespaced_pod(name, ns, state)
    only_this_pod = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid))
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=ns), delete_options=only_this_pod)
    try:
        core.create_namespaced_pod_eviction(name, ns, body)
    except client.ApiException as e:  # the controller saw CheckpointedEvicted and deleted it first
        if e.status not in (404, 409):  # (the driver's KubeEvictor ignores NotFound the same way)
            raise


def test_a_worker_evicted_by_the_fallback_is_recreated_and_resumes_from_s3_bit_exact(
    cluster: ClusterHandle,
    api: Any,
    world: dict[str, Any],  # noqa: F811  # tests/support/erj_cluster.py's fixture
    s3: S3Server,  # noqa: F811  # tests/support/s3_fixtures.py's MinIO
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ns, core = world["ns"], client.CoreV1Api(api)
    bucket = f"ckpt-{secrets.token_hex(4)}"
    url = f"s3://{bucket}/{ns}/{JOB}"
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)  # the test reads the bucket too
    core.create_namespaced_secret(ns, client.V1Secret(metadata=client.V1ObjectMeta(name=SECRET), string_data=s3.env()))
    bucket_view(s3).mkdir(bucket)
    out = tmp_path / "worker-out.pt"
    kubectl(cluster, "apply", "-f", "-", stdin=_job(ns, url, out))

    first = _running_worker(api, ns)
    env = _kubelet_env(core, first)
    assert (env["ROSE_CHECKPOINT_PATH"], env["ROSE_RESTORE"]) == (url, "latest")
    proc = _run_container(core, first)
    try:
        wait_checkpoint(s3, url, PARK_AT, proc)  # the workload's durable checkpoint is in S3
        _fallback_evict(core, first)
    finally:
        proc.kill()  # the kubelet stops the evicted pod's container
        proc.communicate()

    second = _running_worker(api, ns, not_uid=first.metadata.uid)
    # the replacement takes the lowest free worker index: the lost pod's own once the API server
    # has removed it, the next one while the lost pod is still terminating (a race the controller
    # does not wait out: a lost worker holds nothing, so its replacement is not held back)
    assert second.metadata.name in (f"{JOB}-w0", f"{JOB}-w1"), second.metadata.name
    assert second.metadata.labels[names.LABEL_JOB] == JOB
    log = finish(_run_container(core, second))
    assert ready_step(log) == PARK_AT, f"the recreated worker did not restore: {log[:500]}"
    assert_same_run(torch.load(out, weights_only=False), uninterrupted(tmp_path / "whole.pt"))
    kubectl(cluster, "delete", "elasticrljob", JOB, "-n", ns, "--wait=true")
