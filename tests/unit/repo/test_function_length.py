"""``hack/check-function-length.py``: no production function over 80 lines outside the declared
wiring modules. The repository passes it, and it catches a function one line over the limit."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[3] / "hack" / "check-function-length.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_function_length", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _function(name: str, lines: int, indent: str = "") -> str:
    """A function of exactly ``lines`` lines (its ``def`` included)."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
    return f"{indent}def {name}() -> int:\n{body}{indent}    return 0\n"


def test_the_repository_has_no_long_function_outside_wiring() -> None:
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_function_one_line_over_the_limit_is_reported() -> None:
    check = _script()
    src = _function("fits", 80) + "\n\n" + _function("too_long", 81)
    assert check.long_functions(src) == [(80 + 2 + 1, "too_long", 81)]  # after 80 lines and 2 blank ones


def test_decorators_and_nesting_count() -> None:
    check = _script()
    src = "class C:\n    @staticmethod\n" + _function("m", 80, indent="    ")
    assert check.long_functions(src) == [(3, "C.m", 81)]
    outer = "def outer() -> None:\n" + _function("inner", 85, indent="    ")
    assert [name for _, name, _ in check.long_functions(outer)] == ["outer", "outer.inner"]


def test_the_script_fails_on_a_long_function_and_says_where(tmp_path: Path) -> None:
    bad = tmp_path / "long.py"
    bad.write_text(_function("too_long", 90))
    r = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.strip().endswith("long.py:1: too_long is 90 lines (limit 80)"), r.stdout


def test_a_missing_path_is_one_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "nope")], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 2
    assert r.stderr.strip() == f"check-function-length: error: {tmp_path / 'nope'}: not a Python file or folder"
