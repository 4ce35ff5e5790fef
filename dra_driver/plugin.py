"""The kubelet plugin: registration service and DRAPlugin v1 + v1beta1 on unix sockets (CONTRACTS §C).

The DRA service socket starts first, then the registration socket (like the Go helper); the
kubelet's plugin watcher finds the registration socket, calls GetInfo, connects to the endpoint
and calls NotifyRegistrationStatus. v1beta1 is served by translating onto v1 (identical wire
format, minus ``Device.share_id``).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from dra_driver.claims import ClaimRef
from dra_driver.node import NodeDriver
from rose_common import names
from rose_common.proto import (
    k8s_dra_v1_pb2,
    k8s_dra_v1_pb2_grpc,
    k8s_dra_v1beta1_pb2,
    k8s_dra_v1beta1_pb2_grpc,
    k8s_pluginregistration_pb2,
    k8s_pluginregistration_pb2_grpc,
)

log = logging.getLogger("rose.driver.plugin")

SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
PLUGIN_TYPE = "DRAPlugin"
MAX_UNIX_PATH = 107


class SocketPathError(ValueError):
    pass


def _refs(claims: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


def _bad_claims(refs: list[ClaimRef]) -> dict[str, str]:
    """Claims the kubelet sent without the fields we need: a per-claim error each."""
    out = {}
    for r in refs:
        missing = [f for f in ("namespace", "uid", "name") if not getattr(r, f)]
        if missing:
            out[r.uid] = f"claim {r.namespace}/{r.name} (uid {r.uid!r}) lacks {', '.join(missing)}"
    return out


class DRAPluginV1(k8s_dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(self, driver: NodeDriver) -> None:
        self.driver = driver

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        refs = _refs(request.claims)
        bad = _bad_claims(refs)
        resp = k8s_dra_v1_pb2.NodePrepareResourcesResponse()
        outcomes = self.driver.prepare([r for r in refs if r.uid not in bad])
        for uid, err in bad.items():
            resp.claims[uid].error = err
        for uid, o in outcomes.items():
            entry = resp.claims[uid]
            if o.error:
                entry.error = o.error
                continue
            for d in o.devices:
                entry.devices.add(
                    request_names=list(d.request_names),
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=list(d.cdi_ids),
                )
        return resp

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        refs = _refs(request.claims)
        bad = _bad_claims(refs)
        resp = k8s_dra_v1_pb2.NodeUnprepareResourcesResponse()
        for uid, err in bad.items():
            resp.claims[uid].error = err
        for uid, e in self.driver.unprepare([r for r in refs if r.uid not in bad]).items():
            resp.claims[uid].error = e
        return resp


class DRAPluginV1beta1(k8s_dra_v1beta1_pb2_grpc.DRAPluginServicer):
    """v1beta1 onto v1: the messages are wire-identical except v1's optional Device.share_id."""

    def __init__(self, v1: DRAPluginV1) -> None:
        self.v1 = v1

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        req = k8s_dra_v1_pb2.NodePrepareResourcesRequest.FromString(request.SerializeToString())
        resp = self.v1.NodePrepareResources(req, context)
        for entry in resp.claims.values():
            for d in entry.devices:
                d.ClearField("share_id")
        return k8s_dra_v1beta1_pb2.NodePrepareResourcesResponse.FromString(resp.SerializeToString())

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        req = k8s_dra_v1_pb2.NodeUnprepareResourcesRequest.FromString(request.SerializeToString())
        resp = self.v1.NodeUnprepareResources(req, context)
        return k8s_dra_v1beta1_pb2.NodeUnprepareResourcesResponse.FromString(resp.SerializeToString())


class Registration(k8s_pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(
        self,
        driver_name: str,
        endpoint: str,
        on_registered: Callable[[], None],
        on_failed: Callable[[str], None],
    ) -> None:
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.on_registered = on_registered
        self.on_failed = on_failed

    def GetInfo(self, request: Any, context: Any) -> Any:
        return k8s_pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=self.endpoint,
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        if request.plugin_registered:
            log.info("registered with kubelet", extra={"driver": self.driver_name})
            self.on_registered()
        else:
            err = request.error or "(the kubelet gave no reason)"
            log.error("kubelet refused registration", extra={"driver": self.driver_name, "err": err})
            self.on_failed(err)
        return k8s_pluginregistration_pb2.RegistrationStatusResponse()


def _prepare_socket(path: Path) -> None:
    if len(str(path)) > MAX_UNIX_PATH:
        raise SocketPathError(
            f"unix socket path {path} is {len(str(path))} bytes; the limit is {MAX_UNIX_PATH}: use a shorter "
            "--plugin-dir / --registry-dir"
        )
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    try:
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()  # our own stale socket from a previous run
        else:
            raise SocketPathError(f"{path} exists and is not a socket; remove it or choose another path")
    except FileNotFoundError:
        pass


@dataclass
class PluginServers:
    dra: grpc.Server
    registration: grpc.Server
    dra_socket: Path
    registration_socket: Path

    def stop(self, grace: float = 1.0) -> None:
        self.registration.stop(grace).wait()  # deregister first: removing the socket deregisters
        self.registration_socket.unlink(missing_ok=True)
        self.dra.stop(grace).wait()
        self.dra_socket.unlink(missing_ok=True)


def start_plugin(
    driver: NodeDriver,
    plugin_dir: Path,
    registry_dir: Path,
    *,
    kubelet_endpoint: str | None = None,
    on_registered: Callable[[], None] = lambda: None,
    on_failed: Callable[[str], None] = lambda err: None,
    driver_name: str = names.DRIVER_NAME,
) -> PluginServers:
    """Serve DRAPlugin on ``plugin_dir/dra.sock`` then registration on ``registry_dir/<driver>-reg.sock``.

    ``kubelet_endpoint`` is the DRA socket path as the kubelet sees it (defaults to the local path).
    """
    dra_sock = plugin_dir / "dra.sock"
    reg_sock = registry_dir / f"{driver_name}-reg.sock"
    _prepare_socket(dra_sock)
    _prepare_socket(reg_sock)

    dra = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="dra"))
    v1 = DRAPluginV1(driver)
    k8s_dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(v1, dra)  # type: ignore[no-untyped-call]
    k8s_dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(DRAPluginV1beta1(v1), dra)  # type: ignore[no-untyped-call]
    dra.add_insecure_port(f"unix://{dra_sock}")
    dra.start()
    os.chmod(dra_sock, 0o600)

    reg = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="reg"))
    endpoint = kubelet_endpoint or str(dra_sock)
    k8s_pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(
        Registration(driver_name, endpoint, on_registered, on_failed), reg
    )  # type: ignore[no-untyped-call]
    reg.add_insecure_port(f"unix://{reg_sock}")
    reg.start()
    os.chmod(reg_sock, 0o600)
    log.info("kubelet plugin serving", extra={"draSocket": str(dra_sock), "registrationSocket": str(reg_sock)})
    return PluginServers(dra=dra, registration=reg, dra_socket=dra_sock, registration_socket=reg_sock)
