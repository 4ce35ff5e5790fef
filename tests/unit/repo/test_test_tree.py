"""The test tree's own rules (``tests/README.md``, *The layout*): tests live in
``tests/<tier>/<package>/test_*.py`` with no ``__init__.py`` and a basename unique across the
tree (pytest imports a test module by its basename); shared helpers live in ``tests/support/``,
never named ``test_*``; and no module of ``tests/`` or ``benchmarks/`` imports a test module,
by its full name (``tests.unit.…``) or by its basename (which pytest's ``prepend`` import mode
would also resolve). Each check is also run on a tree that breaks it, so it can fail."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TIERS = ("unit", "contract", "e2e", "device")
T = "tests."  # (spelt apart in the sample trees below, so that a grep for such imports finds none here)


def tier_modules(tests: Path) -> list[Path]:
    return sorted(p for tier in TIERS for p in (tests / tier).rglob("test_*.py"))


def imported_test_modules(source: str, basenames: set[str]) -> list[str]:
    """The test modules ``source`` imports: any module under ``tests.<tier>`` (and the names taken
    from such a package), or a module named like a test module's basename."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        for m in modules:
            parts = m.split(".")
            if (parts[0] == "tests" and len(parts) > 1 and parts[1] in TIERS) or parts[0] in basenames:
                found.append(m)
                break
    return found


def import_violations(repo: Path) -> list[str]:
    tests = repo / "tests"
    basenames = {p.stem for p in tier_modules(tests)}
    sources = [*tests.rglob("*.py"), *(repo / "benchmarks").rglob("*.py")]
    out: list[str] = []
    for path in sorted(sources):
        for m in imported_test_modules(path.read_text(), basenames):
            out.append(f"{path.relative_to(repo)} imports {m}")
    return out


def layout_violations(repo: Path) -> list[str]:
    tests = repo / "tests"
    modules = tier_modules(tests)
    out = [
        f"{n}.py: {c} test modules share this basename" for n, c in Counter(p.stem for p in modules).items() if c > 1
    ]
    out += [
        f"{p.relative_to(repo)}: not tests/<tier>/<package>/" for p in modules if len(p.relative_to(tests).parts) != 3
    ]
    out += [
        f"{p.relative_to(repo)}: an __init__.py in a tier folder"
        for t in TIERS
        for p in (tests / t).rglob("__init__.py")
    ]
    out += [f"{p.relative_to(repo)}: a support module named test_*" for p in (tests / "support").rglob("test_*.py")]
    return sorted(out)


def test_no_test_module_imports_another() -> None:
    bad = import_violations(ROOT)
    assert not bad, "move what is shared to tests/support/ and import it from there:\n" + "\n".join(bad)


def test_the_tree_keeps_its_layout() -> None:
    assert not layout_violations(ROOT), "\n".join(layout_violations(ROOT))


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_each_way_of_importing_a_test_module_is_found(tmp_path: Path) -> None:
    repo = _tree(
        tmp_path,
        {
            "tests/unit/pkg/test_a.py": "X = 1\n",
            "tests/unit/pkg/test_b.py": f"from {T}unit.pkg.test_a import X\n",
            "tests/unit/pkg/test_c.py": f"from {T}unit.pkg import test_a as a\n",
            "tests/e2e/pkg/test_d.py": f"import {T}unit.pkg.test_a\n",
            "tests/e2e/pkg/test_e.py": "from test_a import X\n",
            "tests/support/helper.py": "import test_b\n",
            "benchmarks/bench.py": f"from {T}e2e import pkg\n",
            "tests/contract/pkg/test_f.py": "from tests.support.helper import Y\nimport tests.support\n",
        },
    )
    assert import_violations(repo) == [
        "benchmarks/bench.py imports tests.e2e",
        "tests/e2e/pkg/test_d.py imports tests.unit.pkg.test_a",
        "tests/e2e/pkg/test_e.py imports test_a",
        "tests/support/helper.py imports test_b",
        "tests/unit/pkg/test_b.py imports tests.unit.pkg.test_a",
        "tests/unit/pkg/test_c.py imports tests.unit.pkg",
    ]


def test_a_broken_layout_is_found(tmp_path: Path) -> None:
    repo = _tree(
        tmp_path,
        {
            "tests/unit/a/test_same.py": "",
            "tests/e2e/b/test_same.py": "",
            "tests/unit/test_flat.py": "",
            "tests/unit/a/__init__.py": "",
            "tests/support/test_helper.py": "",
        },
    )
    assert layout_violations(repo) == [
        "test_same.py: 2 test modules share this basename",
        "tests/support/test_helper.py: a support module named test_*",
        "tests/unit/a/__init__.py: an __init__.py in a tier folder",
        "tests/unit/test_flat.py: not tests/<tier>/<package>/",
    ]
