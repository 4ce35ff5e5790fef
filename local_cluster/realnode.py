"""One node run by a real kubelet and containerd next to the KWOK nodes (docs/real-node.md).

I/O boundary: starts and stops two processes (containerd 2.x with a private root, state and
socket; the kubelet v1.37) under ``<cluster dir>/realnode``, writes their configuration files, a
node client certificate signed by the local cluster's CA, and OCI archives it imports into
containerd with ``ctr``; :func:`real_node_status` reads pid files and ``/proc``. The
configuration builders (:func:`containerd_config`, :func:`kubelet_config`, :func:`oci_archive`,
:func:`host_python_mounts`) are pure. Pods on this node use host networking: no
CNI plugin is installed, so the node reports ``NetworkReady=false`` and carries the
``node.kubernetes.io/not-ready`` taint; test pods tolerate it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from local_cluster import binaries, pki
from local_cluster.cluster import ClusterError, ClusterHandle, log_tail, reserved_port
from rose_common import names
from rose_common.atomic import atomic_write

NODE_NAME = "rose-real-node"
PAUSE_REF = "localhost/rose-pause"
COMPONENTS = ("containerd", "kubelet")


@dataclass(frozen=True)
class RealNodeBinaries:
    kubelet: Path
    containerd_dir: Path  # containerd, containerd-shim-runc-v2, ctr
    pause: Path
    pause_version: str
    runc: Path


def load_binaries() -> RealNodeBinaries:
    """The paths hack/build-binaries.sh real-node wrote to realnode.env; a clear error if absent."""
    env = binaries.cache_dir() / "bin" / "realnode.env"
    if not env.exists():
        raise ClusterError(
            f"the real node's binaries are not built ({env} is missing): run `hack/build-binaries.sh real-node`"
        )
    v = dict(line.split("=", 1) for line in env.read_text().splitlines() if "=" in line)
    b = RealNodeBinaries(
        kubelet=Path(v["ROSE_KUBELET_BIN"]),
        containerd_dir=Path(v["ROSE_CONTAINERD_DIR"]),
        pause=Path(v["ROSE_PAUSE_BIN"]),
        pause_version=v["ROSE_PAUSE_VERSION"],
        runc=Path(v["ROSE_RUNC_BIN"]),
    )
    for p in (b.kubelet, b.containerd_dir / "containerd", b.containerd_dir / "ctr", b.pause, b.runc):
        if not p.exists():
            raise ClusterError(f"{p} is missing: run `hack/build-binaries.sh real-node`")
    return b


@dataclass(frozen=True)
class Layout:
    """Every path of the real node, under one directory."""

    dir: Path

    @property
    def containerd_root(self) -> Path:
        return self.dir / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.dir / "containerd" / "state"

    @property
    def containerd_sock(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    @property
    def cdi_dir(self) -> Path:
        return self.dir / "cdi"

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    @property
    def plugins_registry(self) -> Path:
        return self.kubelet_root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.kubelet_root / "plugins"


# ------------------------------------------------------------------ pure configuration builders
def containerd_config(lay: Layout, snapshotter: str, runc: Path, pause_image: str) -> str:
    """containerd 2.x config (version 3): private root/state/socket, CRI with CDI, runc via the shim."""
    cri_rt = "plugins.'io.containerd.cri.v1.runtime'"
    cri_img = "plugins.'io.containerd.cri.v1.images'"
    return "\n".join(
        [
            "version = 3",
            f'root = "{lay.containerd_root}"',
            f'state = "{lay.containerd_state}"',
            "[grpc]",
            f'  address = "{lay.containerd_sock}"',
            "[ttrpc]",
            f'  address = "{lay.containerd_sock}.ttrpc"',
            "[debug]",
            '  level = "info"',
            f"[{cri_img}]",
            f'  snapshotter = "{snapshotter}"',
            f"[{cri_img}.pinned_images]",
            f'  sandbox = "{pause_image}"',
            f"[{cri_rt}]",
            "  enable_cdi = true",
            # this machine's root lacks CAP_SYS_RESOURCE: runc cannot set the sandbox's
            # oom_score_adj of -998 ("can't get final child's PID from pipe: EOF")
            "  restrict_oom_score_adj = true",
            f'  cdi_spec_dirs = ["{lay.cdi_dir}"]',
            f"[{cri_rt}.containerd]",
            '  default_runtime_name = "runc"',
            f"[{cri_rt}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{cri_rt}.containerd.runtimes.runc.options]",
            f'  BinaryName = "{runc}"',
            "  SystemdCgroup = false",
            f"[{cri_rt}.cni]",
            f'  bin_dirs = ["{lay.dir / "cni" / "bin"}"]',
            f'  conf_dir = "{lay.dir / "cni" / "net.d"}"',
            "",
        ]
    )


def kubelet_config(lay: Layout, ca: Path, address: str, port: int, healthz_port: int) -> dict[str, Any]:
    """KubeletConfiguration: cgroupfs, the private containerd, x509 client auth, cgroup v1 allowed."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # this machine mounts cgroup v1 controllers; v1.35+ kubelets refuse them unless told
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{lay.containerd_sock}",
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "x509": {"clientCAFile": str(ca)},
            "webhook": {"enabled": False},
            "anonymous": {"enabled": False},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "failSwapOn": False,
        # a shared development machine: never evict test pods for its disk or memory use
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "registerNode": True,
        "resolvConf": "/etc/resolv.conf",
        "serializeImagePulls": False,
        "featureGates": {"InPlacePodVerticalScaling": True},
    }


def _blob(dir_: Path, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    (dir_ / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (dir_ / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def oci_archive(
    out: Path,
    ref: str,
    files: dict[str, tuple[bytes, int]],
    entrypoint: list[str],
    links: dict[str, str] | None = None,
) -> Path:
    """An OCI image archive (one gzip layer holding ``files``: path → (bytes, mode), and the
    symlinks ``links``: path → target) named ``ref``.

    Deterministic: fixed mtimes and owners, so the same files give the same digest.
    """
    layer_raw = io.BytesIO()
    with tarfile.open(fileobj=layer_raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
        for path, target in sorted((links or {}).items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, 0
            tar.addfile(info)
    raw = layer_raw.getvalue()
    gz = gzip.compress(raw, mtime=0)
    stage = out.with_suffix(".d")
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(raw).hexdigest()}"]},
    }
    cfg = _blob(stage, json.dumps(config, sort_keys=True).encode())
    layer = _blob(stage, gz)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
    }
    man = _blob(stage, json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **man,
                "annotations": {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref},
            }
        ],
    }
    (stage / "index.json").write_text(json.dumps(index))
    (stage / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    with tarfile.open(out, "w") as tar:
        tar.add(stage, arcname=".")
    shutil.rmtree(stage)
    return out


HOST_PYTHON_REF = "localhost/rose-host-python:1"
# the merged-/usr symlinks of a Debian root, so the host's /usr mounted read-only is a whole system
HOST_PYTHON_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}


def host_python_archive(out: Path) -> Path:
    """An image with no Python of its own: the merged-/usr symlinks, an empty ``/tmp`` and
    ``/etc/ld.so.cache`` as mount points. Pods run the host's interpreter in it through read-only
    hostPath mounts (:func:`host_python_mounts`); the ROSE image cannot run the example trainer
    (no torch: the ``workload`` extra is not in it; no ``examples/``), docs/real-node.md."""
    files = {"tmp/.keep": (b"", 0o644), "etc/ld.so.cache": (b"", 0o644)}
    return oci_archive(out, HOST_PYTHON_REF, files, ["/usr/bin/false"], links=HOST_PYTHON_LINKS)


def host_python_mounts(python_prefixes: list[Path], repo: Path) -> list[tuple[str, str]]:
    """Pure: (host path, hostPath type) of what a host interpreter needs read-only in a container
    of :func:`host_python_archive`: ``/usr``, the loader's cache, the interpreter's prefixes (a
    venv and the base it names) and the repository; nested paths only once."""
    paths = sorted({Path("/usr"), *python_prefixes, repo}, key=lambda p: (len(p.parts), str(p)))
    keep: list[Path] = []
    for p in paths:
        if not any(p == k or k in p.parents for k in keep):
            keep.append(p)
    return [("/etc/ld.so.cache", "File")] + [(str(p), "Directory") for p in sorted(keep)]


# ------------------------------------------------------------------ credentials
def node_credentials(p: pki.Pki, node: str) -> tuple[Path, Path]:
    """A client certificate ``system:node:<node>`` (group system:nodes) signed by the cluster CA."""
    crt, key = p.crt(f"node-{node}"), p.key(f"node-{node}")
    if crt.exists() and key.exists():
        return crt, key
    ca_key = serialization.load_pem_private_key(p.ca_key.read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate(p.ca_crt.read_bytes())
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    k = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.subject)
        .public_key(k.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    atomic_write(
        key,
        k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        mode=0o600,
    )
    atomic_write(crt, cert.public_bytes(serialization.Encoding.PEM), mode=0o600)
    return crt, key


# ------------------------------------------------------------------ the processes
def node_ip() -> str:
    """This machine's address on its default route (the kubelet refuses a loopback node IP).

    A UDP ``connect`` only picks the route; nothing is sent.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))
        except OSError as e:
            raise ClusterError(f"no non-loopback IPv4 route on this machine for the kubelet's node IP: {e}") from e
        return str(s.getsockname()[0])


def overlay_works(probe_dir: Path) -> str | None:
    """None if an overlay mount works in ``probe_dir``'s filesystem, else the mount error."""
    d = probe_dir / "overlay-probe"
    for sub in ("lower", "upper", "work", "merged"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={d / 'lower'},upperdir={d / 'upper'},workdir={d / 'work'}"
    r = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", opts, str(d / "merged")],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode == 0:
        subprocess.run(["umount", str(d / "merged")], check=False)
        return None
    return (r.stderr or r.stdout).strip() or f"mount exited {r.returncode}"


class RealNode:
    """Start, wait for and stop the real node of a running local cluster."""

    def __init__(
        self, handle: ClusterHandle, node: str = NODE_NAME, progress: Callable[[str], None] | None = None
    ) -> None:
        self.h = handle
        self.node = node
        self.lay = Layout(handle.workdir / "realnode")
        self.logs = handle.workdir / "logs"
        self.pids = handle.workdir / "pids"
        self._progress = progress or (lambda _m: None)
        self.snapshotter = "overlayfs"
        self.snapshotter_reason = ""
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def log(self, comp: str) -> Path:
        return self.logs / f"realnode-{comp}.log"

    def _tail(self, comp: str) -> str:
        return f"Last lines of {self.log(comp)}:\n{log_tail(self.log(comp))}"

    def _spawn(self, comp: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with self.log(comp).open("ab") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
            )
        (self.pids / f"realnode-{comp}.pid").write_text(str(proc.pid))
        self._procs[comp] = proc
        return proc

    def _wait(self, comp: str, proc: subprocess.Popen[bytes], check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ClusterError(f"{comp} of the real node exited with code {proc.returncode}. {self._tail(comp)}")
            try:
                if check():
                    return
            except Exception:  # not ready yet
                pass
            time.sleep(0.5)
        raise ClusterError(f"{comp} of the real node was not ready within {timeout:.0f}s. {self._tail(comp)}")

    def ctr(self, bins: RealNodeBinaries, *args: str) -> str:
        r = subprocess.run(
            [str(bins.containerd_dir / "ctr"), "--address", str(self.lay.containerd_sock), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode != 0:
            raise ClusterError(f"ctr {' '.join(args)} failed: {r.stderr.strip()}")
        return r.stdout

    def pause_image(self, bins: RealNodeBinaries) -> str:
        return f"{PAUSE_REF}:{bins.pause_version}"

    def import_archive(self, bins: RealNodeBinaries, archive: Path) -> None:
        self.ctr(bins, "images", "import", str(archive))

    def up(self) -> float:
        """Start containerd and the kubelet; return seconds until the node registered."""
        t0 = time.monotonic()
        bins = load_binaries()
        for d in (
            self.lay.dir,
            self.lay.cdi_dir,
            self.lay.kubelet_root,
            self.lay.containerd_root,
            self.lay.containerd_state,
        ):
            d.mkdir(parents=True, exist_ok=True)
        why = overlay_works(self.lay.dir)
        if why is not None:
            self.snapshotter, self.snapshotter_reason = "native", f"overlay mount failed: {why}"
            self._progress(f"real node: snapshotter native ({self.snapshotter_reason})")
        cfg = self.lay.dir / "containerd.toml"
        cfg.write_text(containerd_config(self.lay, self.snapshotter, bins.runc, self.pause_image(bins)))
        env = dict(os.environ, PATH=f"{bins.containerd_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        self._progress("real node: starting containerd")
        cd = self._spawn("containerd", [str(bins.containerd_dir / "containerd"), "--config", str(cfg)], env)
        self._wait("containerd", cd, lambda: self.lay.containerd_sock.exists() and bool(self.ctr(bins, "version")), 60)
        pause_tar = oci_archive(
            self.lay.dir / "pause.tar", self.pause_image(bins), {"pause": (bins.pause.read_bytes(), 0o755)}, ["/pause"]
        )
        self.import_archive(bins, pause_tar)
        self._start_kubelet(bins)
        return time.monotonic() - t0

    def _start_kubelet(self, bins: RealNodeBinaries) -> None:
        p = pki.Pki(self.h.workdir / "pki")
        crt, key = node_credentials(p, self.node)
        kc = self.lay.dir / "kubelet.kubeconfig"
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "rose-local", "cluster": {"server": self.h.server, "certificate-authority": str(p.ca_crt)}}
            ],
            "users": [{"name": "node", "user": {"client-certificate": str(crt), "client-key": str(key)}}],
            "contexts": [{"name": "rose-local", "context": {"cluster": "rose-local", "user": "node"}}],
            "current-context": "rose-local",
        }
        kc.write_text(yaml.safe_dump(doc))
        healthz = reserved_port()
        conf = self.lay.dir / "kubelet.yaml"
        ip = node_ip()
        conf.write_text(yaml.safe_dump(kubelet_config(self.lay, p.ca_crt, ip, reserved_port(), healthz)))
        labels = f"{names.LABEL_GPU_NODE}=true,{names.LABEL_POOL}=pool-0,rose.io/real-node=true"
        argv = [
            str(bins.kubelet),
            f"--config={conf}",
            f"--kubeconfig={kc}",
            f"--root-dir={self.lay.kubelet_root}",
            f"--cert-dir={self.lay.dir / 'kubelet-pki'}",
            f"--hostname-override={self.node}",
            f"--node-ip={ip}",
            f"--node-labels={labels}",
            "--v=2",
        ]
        self._progress("real node: starting the kubelet")
        kl = self._spawn("kubelet", argv)
        import urllib.request

        self._wait(
            "kubelet",
            kl,
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{healthz}/healthz", timeout=2).status == 200,
            120,
        )

    def down(self) -> list[str]:
        """Stop the kubelet, the pods' shims, containerd; unmount what they left mounted."""
        stopped = []
        for comp in ("kubelet", "containerd"):
            f = self.pids / f"realnode-{comp}.pid"
            try:
                pid = int(f.read_text())
            except (OSError, ValueError):
                continue
            if _kill(pid, own=self._procs.get(comp)):
                stopped.append(f"realnode-{comp}")
            if comp in self._procs:
                self._procs.pop(comp).wait()
            f.unlink(missing_ok=True)
            if comp == "kubelet":
                continue
        for pid in _shims(self.lay.containerd_sock):
            _kill(pid)
        _unmount_under(self.lay.dir)
        return stopped


def _kill(pid: int, timeout: float = 10.0, own: subprocess.Popen[bytes] | None = None) -> bool:
    """SIGTERM, up to ``timeout`` s for ``pid`` to exit, then SIGKILL; False if it was gone already.
    ``own``: the Popen when ``pid`` is this process's child, which is reaped here: an exited child
    stays a zombie that ``kill(pid, 0)`` still finds, so unreaped it looked alive for the whole
    ``timeout`` (10 s each for the kubelet and containerd in every real-node teardown)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if own is not None and own.poll() is not None:
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return True


def _shims(sock: Path) -> list[int]:
    """Pids of containerd-shim-runc-v2 processes started by the containerd at ``sock``."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"containerd-shim-runc-v2") and str(sock).encode() in cmd:
            out.append(int(d.name))
    return out


def _unmount_under(root: Path) -> None:
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].encode().decode("unicode_escape")
        if mp == str(root) or mp.startswith(f"{root}/"):
            mounts.append(mp)
    for mp in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], check=False, capture_output=True)


def stop_real_node(workdir: Path) -> list[str]:
    """Stop the real node of the cluster in ``workdir`` if it has one (`rose cluster down`)."""
    state = workdir / "cluster.json"
    if not (workdir / "realnode").exists() or not state.exists():
        return []
    return RealNode(ClusterHandle.from_json(state.read_text())).down()


def real_node_status(workdir: Path) -> list[dict[str, Any]]:
    """`rose cluster status` rows of the real node of the cluster in ``workdir``: containerd and
    the kubelet (from their pid files; a dead one with its log tail) and the pods'
    ``containerd-shim-runc-v2`` processes; none when it has no real node."""
    lay = Layout(workdir / "realnode")
    rows: list[dict[str, Any]] = []
    for comp in COMPONENTS:
        f = workdir / "pids" / f"realnode-{comp}.pid"
        try:
            pid = int(f.read_text())
        except (OSError, ValueError):
            continue
        log = workdir / "logs" / f"realnode-{comp}.log"
        alive = Path(f"/proc/{pid}").exists()
        row: dict[str, Any] = {"component": f"realnode-{comp}", "pid": pid, "alive": alive, "port": None}
        row["log"] = str(log)
        if not alive:
            row["log_tail"] = log_tail(log)
        rows.append(row)
    if rows:
        shim_log = str(workdir / "logs" / "realnode-containerd.log")
        rows += [
            {"component": "realnode-shim", "pid": pid, "alive": True, "port": None, "log": shim_log}
            for pid in sorted(_shims(lay.containerd_sock))
        ]
    return rows
