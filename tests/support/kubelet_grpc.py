"""The kubelet's side of a DRA plugin: raw unary gRPC calls on the plugin's unix sockets (the
DRA service, v1 or v1beta1, and the plugin-registration service), with the method prefixes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from rose_common.proto import k8s_dra_v1_pb2 as v1

V1 = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"
V1BETA1 = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/"
REG = "/pluginregistration.Registration/"


class Kubelet:
    """The kubelet's side: raw unary calls on the plugin's sockets."""

    def __init__(self, dra_sock: Path, reg_sock: Path) -> None:
        self.dra = grpc.insecure_channel(f"unix://{dra_sock}")
        self.reg = grpc.insecure_channel(f"unix://{reg_sock}")

    def call(self, channel: grpc.Channel, method: str, body: bytes) -> bytes:
        fn = channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        out: bytes = fn(body, timeout=10)
        return out

    def prepare(self, claims: list[dict[str, Any]], version: Any = v1, prefix: str = V1) -> Any:
        req = version.NodePrepareResourcesRequest()
        for c in claims:
            m = c["metadata"]
            req.claims.add(namespace=m["namespace"], uid=m["uid"], name=m["name"])
        raw = self.call(self.dra, prefix + "NodePrepareResources", req.SerializeToString())
        return version.NodePrepareResourcesResponse.FromString(raw)

    def unprepare(self, claims: list[dict[str, Any]], version: Any = v1, prefix: str = V1) -> Any:
        req = version.NodeUnprepareResourcesRequest()
        for c in claims:
            m = c["metadata"]
            req.claims.add(namespace=m["namespace"], uid=m["uid"], name=m["name"])
        raw = self.call(self.dra, prefix + "NodeUnprepareResources", req.SerializeToString())
        return version.NodeUnprepareResourcesResponse.FromString(raw)

    def close(self) -> None:
        self.dra.close()
        self.reg.close()
