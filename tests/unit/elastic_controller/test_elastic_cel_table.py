"""The e2e CEL table (tests/support/elastic_cel_cases.py) has exactly one row per
``x-kubernetes-validations`` rule of the ElasticRLJob CRD, wherever in the schema it sits: a rule
added without a row (or a row whose rule is gone) fails here, so the e2e table cannot go stale."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from rose_common import elasticrljob as erj
from tests.support.elastic_cel_cases import CASES, violating_spec

CRD = Path(__file__).resolve().parents[3] / "manifests" / "crd" / "elasticrljob.yaml"


def _schema() -> dict[str, Any]:
    (version,) = yaml.safe_load(CRD.read_text())["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def cel_rules(node: dict[str, Any], path: str = "") -> list[tuple[str, str]]:
    """(schema path, message) of every CEL rule under ``node`` (properties, items, additionalProperties)."""
    out = [
        (path or ".", str(r.get("message") or r.get("messageExpression") or r["rule"]))
        for r in node.get("x-kubernetes-validations") or []
    ]
    for name, child in (node.get("properties") or {}).items():
        out += cel_rules(child, f"{path}.{name}")
    for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(node.get(key), dict):
            out += cel_rules(node[key], path + suffix)
    return out


def _rows() -> list[tuple[str, str]]:
    return sorted((c.path, c.message) for c in CASES)


def test_every_cel_rule_of_the_crd_has_exactly_one_row() -> None:
    rules = sorted(cel_rules(_schema()))
    missing = sorted(set(rules) - set(_rows()))
    assert not missing, f"CEL rules without a row in tests/support/elastic_cel_cases.py: {missing}"
    assert rules == _rows(), f"rows without a rule in the CRD, or duplicates: {sorted(set(_rows()) - set(rules))}"


def test_a_rule_added_anywhere_is_seen() -> None:
    schema = copy.deepcopy(_schema())
    cond = schema["properties"]["status"]["properties"]["conditions"]["items"]
    cond["x-kubernetes-validations"] = [{"rule": "self.type != 'x'", "message": "new rule"}]
    assert (".status.conditions[]", "new rule") in cel_rules(schema)
    assert set(cel_rules(schema)) - set(_rows()) == {(".status.conditions[]", "new rule")}


def test_each_row_violates_its_rule_in_the_models_and_only_it() -> None:
    """The pydantic models mirror the CEL rules: each row's object fails with its message only."""
    for case in CASES:
        try:
            erj.ElasticRLJobSpec.model_validate(violating_spec(case))
        except ValueError as e:
            text = str(e)
            assert case.message in text, (case.message, text)
            assert not [c.message for c in CASES if c.message != case.message and c.message in text]
        else:
            raise AssertionError(f"the row for {case.message!r} is a valid spec")
