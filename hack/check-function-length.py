#!/usr/bin/env python3
"""No production function longer than 80 lines, outside the declared wiring modules.

    python hack/check-function-length.py            # the packages pyproject's [tool.mypy] lists
    python hack/check-function-length.py PATH ...   # these files or folders instead

A function's length is its lines from its first decorator (or ``def``) to its last line, nested
functions included. Wiring modules (:data:`WIRING`) only declare and connect: an entry point's
flags, a component's metric families. Long there is a list, not a decision, so they are exempt;
anything else that grows past the limit is split. Exit status 1 lists every offender, one line
each (``path:line: name is N lines (limit 80)``); 2 for a bad argument.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 80
# Repository-relative paths: argparse flag tables and metric declarations.
WIRING = frozenset(
    {
        "dra_driver/cli.py",
        "dra_driver/metrics.py",
        "dra_driver/suspend/metrics.py",
        "scheduler_extender/cli.py",
        "scheduler_extender/metrics.py",
    }
)
GENERATED = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


def packages() -> list[Path]:
    """Every package the type checker covers (pyproject's ``[tool.mypy] packages``)."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [ROOT / name for name in conf["tool"]["mypy"]["packages"]]


def python_files(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(f for f in p.rglob("*.py") if not f.name.endswith(GENERATED))
        elif p.is_file() and p.suffix == ".py":
            out.append(p)
        else:
            raise ValueError(f"{p}: not a Python file or folder")
    return out


def long_functions(source: str, limit: int = LIMIT) -> list[tuple[int, str, int]]:
    """``(line, qualified name, length)`` of every function in ``source`` longer than ``limit`` lines."""
    found: list[tuple[int, str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                length = (child.end_lineno or child.lineno) - start + 1
                if length > limit:
                    found.append((child.lineno, prefix + child.name, length))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def relative(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def main(argv: list[str]) -> int:
    try:
        files = python_files([Path(a) for a in argv] or packages())
    except ValueError as e:
        print(f"check-function-length: error: {e}", file=sys.stderr)
        return 2
    stale = sorted(w for w in WIRING if not (ROOT / w).is_file())
    if stale:
        print(f"check-function-length: error: declared wiring modules not found: {', '.join(stale)}", file=sys.stderr)
        return 2
    bad = []
    for f in files:
        rel = relative(f)
        if rel in WIRING:
            continue
        bad += [f"{rel}:{line}: {name} is {n} lines (limit {LIMIT})" for line, name, n in long_functions(f.read_text())]
    for line in bad:
        print(line)
    if bad:
        print(
            f"check-function-length: {len(bad)} function(s) over {LIMIT} lines outside the wiring modules",
            file=sys.stderr,
        )
        return 1
    print(f"check-function-length: {len(files)} files, no function over {LIMIT} lines outside the wiring modules")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
