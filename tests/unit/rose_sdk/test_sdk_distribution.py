"""The ``rose-sdk`` distribution (``sdk/pyproject.toml``) against the sources: it ships exactly the
modules ``rose_sdk`` imports, those import nothing but the standard library and the SDK's declared
dependencies, and its version and pins move with the main project. Read from the sources; the real
install into a fresh virtualenv is ``tests/e2e/rose_sdk/test_sdk_fresh_venv.py``."""

from __future__ import annotations

import re

from packaging.requirements import Requirement
from packaging.version import Version

from tests.support.sdk_dist import (
    MAIN_PYPROJECT,
    REPO,
    SDK_PYPROJECT,
    allowed_external,
    dist_name,
    is_stdlib,
    pyproject,
    sdk_closure,
    shipped_modules,
)


def _requirements(project: dict[str, object], *extras: str) -> dict[str, Requirement]:
    reqs = list(project["dependencies"])  # type: ignore[call-overload]
    optional = project.get("optional-dependencies", {})  # type: ignore[attr-defined]
    for e in extras:
        reqs.extend(optional[e])
    return {dist_name(r): Requirement(r) for r in reqs}


def test_version_in_step_with_the_main_project() -> None:
    assert pyproject(SDK_PYPROJECT)["project"]["version"] == pyproject(MAIN_PYPROJECT)["project"]["version"]


def test_ships_exactly_the_repository_modules_rose_sdk_imports() -> None:
    closure = sdk_closure()
    foreign = sorted(m for m in closure.modules if m.split(".")[0] not in ("rose_sdk", "rose_common"))
    assert not foreign, "rose_sdk imports control-plane code: " + "; ".join(closure.chain(m) for m in foreign)
    needed = {m for m in closure.modules if m.split(".")[0] == "rose_common"}
    shipped = shipped_modules()
    assert needed <= shipped, (
        "rose_sdk imports shared modules the rose-sdk wheel does not ship; add them to py-modules in"
        " sdk/pyproject.toml if they are light (stdlib and the SDK's dependencies only): "
        + "; ".join(closure.chain(m) for m in sorted(needed - shipped))
    )
    assert shipped <= needed, f"sdk/pyproject.toml ships modules rose_sdk never imports: {sorted(shipped - needed)}"


def test_imports_only_the_standard_library_and_declared_dependencies() -> None:
    closure = sdk_closure()
    allowed = allowed_external()
    undeclared = {k: sorted(v) for k, v in closure.external.items() if not is_stdlib(k) and k not in allowed}
    assert not undeclared, (
        f"rose_sdk (or a shared module it imports) imports {undeclared} (package: importing modules), which"
        " the rose-sdk distribution does not declare; an RL image must not need the control plane's"
        " dependencies. Keep such imports out of rose_sdk, or declare a light dependency in sdk/pyproject.toml"
    )
    # and every declared import name is used: no dependency comes along for nothing (trl: the [trl]
    # extra installs the TRL release the integration is tested with; rose_sdk imports transformers only)
    unused = set(allowed) - set(closure.external) - {"trl"}
    assert not unused, f"sdk/pyproject.toml declares dependencies rose_sdk never imports: {sorted(unused)}"


def _generated_versions() -> dict[str, Version]:
    """The protobuf and grpcio versions the shipped stubs were generated with (they refuse older)."""
    out: dict[str, Version] = {}
    for path in sorted((REPO / "rose_common" / "proto").glob("rose_*_pb2*.py")):
        text = path.read_text()
        if m := re.search(r"ValidateProtobufRuntimeVersion\(\s*\S+,\s*(\d+),\s*(\d+),\s*(\d+),", text):
            v = Version(".".join(m.groups()))
            out["protobuf"] = max(out.get("protobuf", v), v)
        if m := re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", text):
            v = Version(m.group(1))
            out["grpcio"] = max(out.get("grpcio", v), v)
    assert set(out) == {"protobuf", "grpcio"}, out
    return out


def _just_below(v: Version) -> Version:
    major, minor, micro = v.release[:3]
    return Version(f"{major}.{minor}.{micro - 1}") if micro else Version(f"{major}.{minor - 1}.999")


def test_runtime_lower_bounds_admit_no_runtime_older_than_the_stubs() -> None:
    """An older runtime than the stubs' generator fails at import (protobuf's gencode check, the
    gRPC stubs' version check): the bound must say so, in the SDK and in the main project."""
    for where, path in (("sdk/pyproject.toml", SDK_PYPROJECT), ("pyproject.toml", MAIN_PYPROJECT)):
        reqs = _requirements(pyproject(path)["project"])
        for name, generated in _generated_versions().items():
            spec = reqs[name].specifier
            assert spec.contains(generated), f"{where}: {name}{spec} refuses {generated}, the stubs' own"
            older = _just_below(generated)
            assert not spec.contains(older), (
                f"{where}: {name}{spec} admits {older}, older than the {generated} the stubs were generated"
                f" with; raise the lower bound to {generated}"
            )


def test_extras_pin_what_the_main_project_tests() -> None:
    sdk = _requirements(pyproject(SDK_PYPROJECT)["project"], "torch", "s3")
    main = _requirements(pyproject(MAIN_PYPROJECT)["project"], "workload")
    for name in ("torch", "s3fs"):
        assert str(sdk[name].specifier) == str(main[name].specifier), f"{name}: rose-sdk and rose[workload] differ"
    sdk = _requirements(pyproject(SDK_PYPROJECT)["project"], "transformers", "trl")
    main = _requirements(pyproject(MAIN_PYPROJECT)["project"], "integrations")
    for name in ("transformers", "trl"):
        assert str(sdk[name].specifier) == str(main[name].specifier), f"{name}: rose-sdk and rose[integrations] differ"
    for name, req in _requirements(pyproject(SDK_PYPROJECT)["project"]).items():
        assert name not in ("torch", "s3fs", "transformers", "trl"), f"{req}: an extra, never a base dependency"


def test_readme_is_the_packages_own() -> None:
    readme = REPO / "sdk" / "README.md"
    assert readme.is_symlink() and readme.resolve() == REPO / "rose_sdk" / "README.md"
