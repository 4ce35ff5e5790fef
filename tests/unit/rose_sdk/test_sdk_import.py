"""The offload path of rose_sdk imports without the agent's gRPC stubs (old protobuf, no grpc)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# A meta-path finder that makes grpc and the generated agent stubs unimportable, as on a GPU image
# whose protobuf runtime is older than the one the stubs were generated with.
_BLOCK = textwrap.dedent(
    """
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "grpc" or name.startswith(("grpc.", "rose_common.proto")):
                raise ImportError(f"blocked for the test: {name}")
            return None
    sys.meta_path.insert(0, Block())
    """
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK + textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_offload_path_imports_without_agent_stubs() -> None:
    r = _run(
        """
        import torch
        import rose_sdk
        from rose_sdk import CooperativeOffloader, save_checkpoint
        t = {"x": torch.arange(8.0)}
        off = CooperativeOffloader(tensors=t, device=torch.device("cpu"))
        off.offload(); off.restore()
        assert torch.equal(t["x"], torch.arange(8.0))
        print("offload ok")
        """
    )
    assert r.returncode == 0 and "offload ok" in r.stdout, r.stderr[-2000:]


def test_agent_client_says_what_is_missing_when_used() -> None:
    r = _run(
        """
        import rose_sdk
        try:
            rose_sdk.init
        except ImportError as e:
            print("import error:", e)
        """
    )
    assert r.returncode == 0 and "import error: blocked for the test" in r.stdout, r.stderr[-2000:]
