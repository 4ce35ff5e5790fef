"""What an end-to-end test needs to talk to the orchestrator as a cluster runs it (TLS, TokenReview,
the job check): a CA and server certificate, a ServiceAccount token of a namespace with the
orchestrator's audience, worker pods that make a job a member of a group, and a verified channel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from rose_common import names
from rose_common.proto import rose_timeslice_v1_pb2_grpc as pb_grpc
from timeslice import certs

AUDIENCE = names.TIMESLICE_TOKEN_AUDIENCE


def tls_files(folder: Path) -> certs.CertFiles:
    return certs.generate(folder, ("localhost", "127.0.0.1"))


def tls_flags(files: certs.CertFiles) -> list[str]:
    return ["--tls-cert", str(files.cert), "--tls-key", str(files.key), "--token-audience", AUDIENCE]


def sa_token(api: Any, namespace: str, sa: str = "ts-caller") -> str:
    """A token of ServiceAccount ``sa`` (created if missing) of ``namespace`` for the orchestrator."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    try:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": sa}})
    except ApiException as e:
        if e.status != 409:
            raise
    req = {"spec": {"audiences": [AUDIENCE], "expirationSeconds": 3600}}
    return str(core.create_namespaced_service_account_token(sa, namespace, req).status.token)


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def member_pod(api: Any, namespace: str, job: str, group: str, priority_class: str = "") -> None:
    """A worker pod of ``namespace/job`` in ``group`` (the labels the controller sets); never scheduled."""
    from kubernetes import client

    spec: dict[str, Any] = {
        "containers": [{"name": "w", "image": "rose/worker"}],
        "nodeSelector": {"rose.io/none": "nowhere"},
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    labels = {names.LABEL_JOB: job, names.LABEL_TIMESLICE_GROUP: group}
    body = {"metadata": {"name": f"{job}-{group}-0"[:63].rstrip("-"), "labels": labels}, "spec": spec}
    client.CoreV1Api(api).create_namespaced_pod(namespace, body)


def channel(target: str, files: certs.CertFiles) -> grpc.Channel:
    return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=files.ca.read_bytes()))


def stub(target: str, files: certs.CertFiles) -> pb_grpc.TimeSliceOrchestratorStub:
    return pb_grpc.TimeSliceOrchestratorStub(channel(target, files))  # type: ignore[no-untyped-call]
