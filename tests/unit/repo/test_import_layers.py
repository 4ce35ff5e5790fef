"""The import-linter contracts (``.importlinter``) hold the layers: run ``lint-imports`` on a copy of
the tree with a pure module made to import ``time`` and another ``os``, and one made to import its
component's orchestration, and see each broken contract named; the unchanged copy passes.

Real import-linter on a temporary copy (the checked-out tree is never edited)."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _copy(tmp: Path) -> Path:
    conf = configparser.ConfigParser()
    conf.read(ROOT / ".importlinter")
    dst = tmp / "tree"
    dst.mkdir()
    for pkg in conf["importlinter"]["root_packages"].split():
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / ".importlinter", dst / ".importlinter")
    return dst


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: install the lint group (hack/setup.sh does)")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(tree / ".importlinter"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _prepend_import(path: Path, line: str) -> None:
    text = path.read_text()
    head, sep, rest = text.partition("from __future__ import annotations\n")
    assert sep, f"{path}: no __future__ import to insert after"
    path.write_text(f"{head}{sep}\n{line}\n{rest}")


def test_the_layers_contracts_break_when_a_pure_module_does_io(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    clean = _lint(tree)
    assert clean.returncode == 0, clean.stdout + clean.stderr

    _prepend_import(tree / "dra_driver" / "state.py", "import time")
    _prepend_import(tree / "timeslice" / "state.py", "import os")
    _prepend_import(tree / "predictor" / "risk.py", "import predictor.service")
    broken = _lint(tree)
    out = broken.stdout + broken.stderr
    assert broken.returncode != 0, out
    assert "dra_driver.state is not allowed to import time" in out, out
    assert "timeslice.state is not allowed to import os" in out, out
    assert "predictor.risk is not allowed to import predictor.service" in out, out
    assert "Contracts: " in out and " broken." in out, out
