"""One logging convention across the components (rose_common.logs): every log call's message is a
constant, lower-case string literal; what varies goes in lowerCamelCase keys (``err``, ``pod``)."""

from __future__ import annotations

import ast
import json
import logging
import re
from pathlib import Path

import pytest

from rose_common.logs import JsonFormatter

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = (
    "scheduler_extender",
    "dra_driver",
    "predictor",
    "elastic_controller",
    "timeslice",
    "rose_sdk",
    "local_cluster",
    "rose_common",
    "rose_cli",
)
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
LOGGERS = {"log", "logger", "logs", "_LOGGER", "LOG", "_log"}
KEY = re.compile(r"^[a-z][a-zA-Z0-9]*$")


def _log_calls() -> list[tuple[str, ast.Call]]:
    calls = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "proto" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                f = node.func if isinstance(node, ast.Call) else None
                if (
                    isinstance(f, ast.Attribute)
                    and f.attr in LEVELS
                    and isinstance(f.value, ast.Name)
                    and f.value.id in LOGGERS
                    and isinstance(node, ast.Call)
                    and node.args
                ):
                    calls.append((f"{path.relative_to(ROOT)}:{node.lineno}", node))
    return calls


def test_there_are_log_calls_to_check() -> None:
    assert len(_log_calls()) > 40


def test_messages_are_constant_lower_case_literals() -> None:
    bad = []
    for where, call in _log_calls():
        msg = call.args[0]
        if not (isinstance(msg, ast.Constant) and isinstance(msg.value, str)):
            bad.append(f"{where}: message is not a string literal: {ast.unparse(msg)}")
        elif msg.value[:1].isupper():
            bad.append(f"{where}: message starts upper case: {msg.value!r}")
    assert not bad, "\n".join(bad)


def test_keys_are_lower_camel_case() -> None:
    bad = []
    for where, call in _log_calls():
        keys = [k.arg for k in call.keywords if k.arg not in (None, "extra", "exc_info", "stack_info")]
        for kw in call.keywords:
            if kw.arg == "extra" and isinstance(kw.value, ast.Dict):
                keys += [k.value for k in kw.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        bad += [f"{where}: key {k!r}" for k in keys if k is not None and not KEY.match(k)]
    assert not bad, "\n".join(bad)


def test_formatter_writes_message_and_keys_as_one_json_line(caplog: pytest.LogCaptureFixture) -> None:
    record = logging.LogRecord("rose.t", logging.WARNING, __file__, 1, "claim prepared", None, None)
    record.pod = "ns/p"
    record.kv = {"err": "boom"}
    out = json.loads(JsonFormatter().format(record))
    assert out["msg"] == "claim prepared" and out["pod"] == "ns/p" and out["err"] == "boom"
    assert out["level"] == "warning" and out["logger"] == "rose.t"
