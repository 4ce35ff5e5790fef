"""The kubelet's part for DRA, played by the harness (KWOK nodes have no kubelet).

What a real kubelet does for a DRA driver, over the real contract (CONTRACTS §C): find the
plugin's registration socket, ``GetInfo``, ``NotifyRegistrationStatus``, then call
``NodePrepareResources`` / ``NodeUnprepareResources`` on the endpoint it advertised, with
only ``{namespace, uid, name}`` of each claim. Plus a launcher for one ``rose driver`` process
per KWOK node with simulated GPUs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import grpc

from local_cluster.cluster import dying_with_parent, stop_process
from rose_common import names, promtext
from rose_common.proto import k8s_dra_v1_pb2 as dra_v1
from rose_common.proto import k8s_pluginregistration_pb2 as reg

DRA_V1 = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"
REGISTRATION = "/pluginregistration.Registration/"


class KubeletDRA:
    """The kubelet's DRA manager for one node: registration, then prepare / unprepare."""

    def __init__(self, registry_dir: Path, driver: str = names.DRIVER_NAME, timeout: float = 45.0) -> None:
        self.reg_socket = registry_dir / f"{driver}-reg.sock"
        self.driver = driver
        self.timeout = timeout  # the kubelet's defaultClientCallTimeout

    def _call(self, sock: Path, method: str, body: bytes) -> bytes:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no plugin socket at {sock}")
            time.sleep(0.1)
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            fn = ch.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
            out: bytes = fn(body, timeout=self.timeout)
            return out

    def register(self) -> Path:
        """GetInfo → validate → NotifyRegistrationStatus(registered); returns the DRA endpoint."""
        info = reg.PluginInfo.FromString(self._call(self.reg_socket, REGISTRATION + "GetInfo", b""))
        if info.type != "DRAPlugin" or info.name != self.driver:
            raise RuntimeError(f"plugin at {self.reg_socket} is {info.type}/{info.name}, not DRAPlugin/{self.driver}")
        if "v1.DRAPlugin" not in info.supported_versions:
            raise RuntimeError(f"plugin supports {list(info.supported_versions)}, not v1.DRAPlugin")
        status = reg.RegistrationStatus(plugin_registered=True)
        self._call(self.reg_socket, REGISTRATION + "NotifyRegistrationStatus", status.SerializeToString())
        return Path(info.endpoint)

    def prepare(self, claim: dict[str, Any]) -> Any:
        """NodePrepareResources for one claim read from the API; returns its per-claim reply."""
        m = claim["metadata"]
        req = dra_v1.NodePrepareResourcesRequest()
        req.claims.add(namespace=m["namespace"], uid=m["uid"], name=m["name"])
        raw = self._call(self.register(), DRA_V1 + "NodePrepareResources", req.SerializeToString())
        return dra_v1.NodePrepareResourcesResponse.FromString(raw).claims[m["uid"]]

    def unprepare(self, claim: dict[str, Any]) -> Any:
        m = claim["metadata"]
        req = dra_v1.NodeUnprepareResourcesRequest()
        req.claims.add(namespace=m["namespace"], uid=m["uid"], name=m["name"])
        raw = self._call(self.register(), DRA_V1 + "NodeUnprepareResources", req.SerializeToString())
        return dra_v1.NodeUnprepareResourcesResponse.FromString(raw).claims[m["uid"]]


class DriverProcess:
    """One ``rose driver`` process for a KWOK node, simulated GPUs, its own sockets and state
    (under ``root/<node>``; node state in the plugin dir, as on a real node)."""

    def __init__(
        self,
        kubeconfig: Path,
        node: str,
        root: Path,
        gpus: int,
        metrics_port: int,
        extra_args: list[str] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.node = node
        self.root = root / node
        self.plugin_dir = self.root / "p"
        self.registry_dir = self.root / "r"
        self.cdi_dir = self.root / "cdi"
        self.metrics_port = metrics_port
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.log_path = root / f"{node}.log"
        self.args = [
            sys.executable, "-m", "dra_driver", "--node-name", node, "--kubeconfig", str(kubeconfig),
            "--gpu-backend", "simulated", "--simulated-gpus", str(gpus),
            "--plugin-dir", str(self.plugin_dir), "--registry-dir", str(self.registry_dir),
            "--cdi-dir", str(self.cdi_dir),
            "--metrics-port", str(metrics_port), "--metrics-address", "127.0.0.1",
            *(extra_args or []),
        ]  # fmt: skip
        self.die_with_parent = die_with_parent  # SIGKILL when the thread that started it exits
        self._log: IO[bytes] = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = self._spawn()
        self.kubelet = KubeletDRA(self.registry_dir)

    def _spawn(self) -> subprocess.Popen[bytes]:
        argv, preexec = dying_with_parent(self.args) if self.die_with_parent else (self.args, None)
        return subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ),
            preexec_fn=preexec,  # noqa: PLW1509 - only without setpriv
        )

    def prepare(self, claim: dict[str, Any]) -> Any:
        return self.kubelet.prepare(claim)

    def unprepare(self, claim: dict[str, Any]) -> Any:
        return self.kubelet.unprepare(claim)

    def kill9_and_restart(self) -> None:
        self.kill9()
        self.proc = self._spawn()

    def kill9(self) -> None:
        """SIGKILL, waited for; :meth:`restart_if_dead` starts it again."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def restart_if_dead(self) -> bool:
        """Start the driver again when its process has exited (a DaemonSet's restart); True if it did."""
        if self.proc.poll() is None:
            return False
        self.proc = self._spawn()
        return True

    def metrics(self) -> list[str]:
        """The driver's /metrics samples (comment lines dropped)."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            return [ln for ln in r.read().decode().splitlines() if ln and not ln.startswith("#")]

    def metric(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """The sum of the driver's /metrics samples ``name`` whose labels include ``labels``; 0 when none."""
        return promtext.value("\n".join(self.metrics()), name, labels, default=0.0)

    def stop(self, timeout: float = 30.0) -> int:
        code = stop_process(self.proc, timeout)
        self._log.close()
        return code
