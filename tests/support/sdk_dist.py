"""What the ``rose-sdk`` distribution (``sdk/pyproject.toml``) ships and what ``rose_sdk`` imports,
read from the sources (no import runs): the helpers of ``tests/unit/rose_sdk/test_sdk_distribution.py`` and
``tests/e2e/rose_sdk/test_sdk_fresh_venv.py``.

Every import statement counts, at any depth (inside functions and ``if TYPE_CHECKING:`` blocks too),
and so does ``importlib.import_module("…")`` with a literal name (``rose_sdk.__init__`` imports
its agent and time-slice clients that way).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SDK_PYPROJECT = REPO / "sdk" / "pyproject.toml"
MAIN_PYPROJECT = REPO / "pyproject.toml"

# The module a distribution of the SDK's dependencies installs (its import name).
IMPORT_NAME = {
    "grpcio": "grpc",
    "protobuf": "google",
    "numpy": "numpy",
    "torch": "torch",
    "s3fs": "s3fs",
    "transformers": "transformers",
    "trl": "trl",
}


def pyproject(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text())


def dist_name(requirement: str) -> str:
    """The normalised distribution name of a requirement string (``"grpcio>=1.8"`` → ``grpcio``)."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert m, f"not a requirement: {requirement!r}"
    return re.sub(r"[-_.]+", "-", m.group(1)).lower()


def repo_packages() -> set[str]:
    """The top-level packages of the main ``rose`` distribution (its setuptools ``find`` include)."""
    include = pyproject(MAIN_PYPROJECT)["tool"]["setuptools"]["packages"]["find"]["include"]
    return {p.rstrip("*") for p in include}


def source(module: str, root: Path = REPO) -> Path | None:
    """The file of ``module`` under ``root`` (a module file or a package's ``__init__.py``)."""
    base = root.joinpath(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _resolve(module: str | None, level: int, importer: str, is_package: bool) -> str:
    if level == 0:
        return module or ""
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def imports_of(path: Path, module: str, root: Path = REPO) -> set[str]:
    """Every module name ``module`` (at ``path``) imports. ``from P import x`` counts ``P.x`` when
    that is a module under ``root``, else ``P``."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module, node.level, module, is_package)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names if source(f"{base}.{a.name}", root) is not None)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.add(node.args[0].value)
    return out


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@dataclass
class Closure:
    """The repository modules reached from ``rose_sdk`` and the outside modules they import."""

    modules: set[str] = field(default_factory=set)
    external: dict[str, set[str]] = field(default_factory=dict)  # top-level name → the modules importing it
    via: dict[str, str] = field(default_factory=dict)  # repository module → the module that first imported it

    def chain(self, module: str) -> str:
        """``rose_sdk.x -> rose_common.y -> …``: how ``module`` was reached."""
        out = [module]
        while out[-1] in self.via:
            out.append(self.via[out[-1]])
        return " -> ".join(reversed(out))


def sdk_closure(root: Path = REPO, start: str = "rose_sdk") -> Closure:
    """Every module of the package ``start`` under ``root``, and transitively every repository
    module they import (with its parent packages, which Python imports first)."""
    local = repo_packages() | {start}
    c = Closure()
    todo: deque[str] = deque(
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for p in sorted((root / start).rglob("*.py"))
    )
    while todo:
        module = todo.popleft()
        if module in c.modules:
            continue
        path = source(module, root)
        assert path is not None, f"{c.chain(module)}: no source for {module} under {root}"
        c.modules.add(module)
        for name in sorted(imports_of(path, module, root)):
            top = name.split(".")[0]
            if top not in local:
                c.external.setdefault(top, set()).add(module)
                continue
            for m in [*_parents(name), name]:
                if m not in c.modules and m not in c.via and m != module:
                    c.via[m] = module
                    todo.append(m)
    return c


def shipped_modules(sdk: dict[str, Any] | None = None) -> set[str]:
    """The modules ``sdk/pyproject.toml`` puts into the wheel besides the ``rose_sdk`` package: its
    ``py-modules`` and the packages that hold them."""
    tool = (sdk or pyproject(SDK_PYPROJECT))["tool"]["setuptools"]
    out: set[str] = set()
    for m in tool.get("py-modules", []):
        out.update([*_parents(m), m])
    return out


# Imported by an engine adapter of rose_sdk.integrations and never installed by rose-sdk: the RL image
# brings it (vLLM is a CUDA build of its own). Imported lazily, inside the adapter (rose_sdk.integrations.vllm).
IMAGE_PROVIDED = {"vllm": "vllm"}


def allowed_external(sdk: dict[str, Any] | None = None) -> dict[str, str]:
    """Import name → the distribution that provides it, for every dependency and extra of the SDK
    (and the packages rose_sdk's engine adapters find in the RL image: ``IMAGE_PROVIDED``)."""
    project = (sdk or pyproject(SDK_PYPROJECT))["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs.extend(extra)
    out: dict[str, str] = {}
    for r in reqs:
        name = dist_name(r)
        assert name in IMPORT_NAME, f"{name}: add its import name to tests/support/sdk_dist.py IMPORT_NAME"
        out[IMPORT_NAME[name]] = name
    return {**IMAGE_PROVIDED, **out}


def is_stdlib(name: str) -> bool:
    return name in sys.stdlib_module_names
