"""The ElasticRLJob pydantic models and the CRD YAML agree: fields, types, defaults, enums, bounds, CEL."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from rose_common import elasticrljob as erj
from rose_common import names

CRD = Path(__file__).resolve().parents[3] / "manifests" / "crd" / "elasticrljob.yaml"
FACETS = ("type", "format", "default", "enum", "minimum", "maximum", "minLength", "maxLength", "pattern")
Flat = dict[str, dict[str, Any]]


def _crd_schema() -> dict[str, Any]:
    doc = yaml.safe_load(CRD.read_text())
    (version,) = doc["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def flatten_crd(node: dict[str, Any], path: str = "", required: bool = False, out: Flat | None = None) -> Flat:
    """path -> facets of every property of an OpenAPI v3 schema (the CRD's dialect)."""
    out = {} if out is None else out
    if path:
        facets = {k: node[k] for k in FACETS if k in node}
        out[path] = {**facets, "required": required}
    for name, child in (node.get("properties") or {}).items():
        flatten_crd(child, f"{path}.{name}", name in node.get("required", []), out)
    if "items" in node:
        flatten_crd(node["items"], f"{path}[]", True, out)
    return out


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        node = {**defs[node["$ref"].split("/")[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    branches = [b for b in node.get("anyOf", []) if b.get("type") != "null"]
    if branches:  # Optional[X]: X's facets, the outer default
        (only,) = branches
        node = {**_resolve(only, defs), **{k: v for k, v in node.items() if k != "anyOf"}}
    return node


def flatten_model(
    node: dict[str, Any], defs: dict[str, Any], path: str = "", required: bool = False, out: Flat | None = None
) -> Flat:
    """path -> facets of a pydantic JSON schema, in the same shape as :func:`flatten_crd`."""
    out = {} if out is None else out
    node = _resolve(node, defs)
    if path:
        facets = {k: node[k] for k in FACETS if k in node and not (k == "default" and node[k] is None)}
        if "const" in node:
            facets["enum"] = [node["const"]]
        out[path] = {**facets, "required": required}
    for name, child in (node.get("properties") or {}).items():
        flatten_model(child, defs, f"{path}.{name}", name in node.get("required", []), out)
    if "items" in node:
        flatten_model(node["items"], defs, f"{path}[]", True, out)
    return out


def _model_flat(model: type[BaseModel], prefix: str) -> Flat:
    schema = model.model_json_schema(by_alias=True)
    return flatten_model(schema, schema.get("$defs", {}), prefix)


def disagreements(crd: dict[str, Any]) -> list[str]:
    """Every field where the CRD and the models differ, as one readable line each."""
    want = flatten_crd(crd)
    want = {k: v for k, v in want.items() if k.startswith((".spec", ".status"))}
    have = {**_model_flat(erj.ElasticRLJobSpec, ".spec"), **_model_flat(erj.ElasticRLJobStatus, ".status")}
    have[".spec"] = {"type": "object", "required": "spec" in crd.get("required", []) and True}
    have[".status"] = {"type": "object", "required": False}
    problems = [f"{p}: in the CRD, not in the model" for p in sorted(want.keys() - have.keys())]
    problems += [f"{p}: in the model, not in the CRD" for p in sorted(have.keys() - want.keys())]
    for p in sorted(want.keys() & have.keys()):
        for facet in sorted(want[p].keys() | have[p].keys()):
            if want[p].get(facet) != have[p].get(facet):
                problems.append(
                    f"{p}: {facet} is {want[p].get(facet)!r} in the CRD, {have[p].get(facet)!r} in the model"
                )
    return problems


def test_model_and_crd_agree_on_every_field() -> None:
    assert disagreements(_crd_schema()) == []


def test_spec_is_required_at_the_top_of_both() -> None:
    assert _crd_schema()["required"] == ["spec"]
    assert erj.ElasticRLJob.model_fields["spec"].is_required()


@pytest.mark.parametrize(
    ("path", "facet", "value"),
    [
        (("spec", "priority"), "maximum", 999),  # a bound
        (("spec", "gpusPerWorker"), "default", 2),  # a default
        (("spec", "suspendPolicy"), "enum", ["HostMemoryFirst"]),  # an enum
        (("spec", "minUsefulRunSeconds"), "type", "number"),  # a type
        (("status", "suspendCount"), "minimum", None),  # a bound removed
    ],
)
def test_the_walk_sees_a_changed_facet(path: tuple[str, str], facet: str, value: Any) -> None:
    crd = copy.deepcopy(_crd_schema())
    node = crd["properties"][path[0]]["properties"][path[1]]
    if value is None:
        del node[facet]
    else:
        node[facet] = value
    problems = disagreements(crd)
    assert any(p.startswith(f".{path[0]}.{path[1]}: {facet}") for p in problems), problems


def test_the_walk_sees_a_missing_field_and_a_changed_required_list() -> None:
    crd = copy.deepcopy(_crd_schema())
    crd["properties"]["spec"]["properties"]["extra"] = {"type": "string"}
    crd["properties"]["spec"]["properties"]["roles"]["properties"]["trainer"]["required"].remove("template")
    problems = disagreements(crd)
    assert ".spec.extra: in the CRD, not in the model" in problems
    assert any(p.startswith(".spec.roles.trainer.template: required") for p in problems), problems


def test_the_walk_sees_condition_fields() -> None:
    crd = copy.deepcopy(_crd_schema())
    cond = crd["properties"]["status"]["properties"]["conditions"]["items"]
    cond["properties"]["type"]["enum"].append("Lost")
    assert any(p.startswith(".status.conditions[].type: enum") for p in disagreements(crd))


_CEL_VIOLATIONS = {
    erj.MSG_MIN_LE_MAX: {"minGPUs": 9, "maxGPUs": 8},
    erj.MSG_MULTIPLES: {"minGPUs": 2, "maxGPUs": 8, "gpusPerWorker": 4},
    erj.MSG_CHECKPOINT: {"minGPUs": 1, "maxGPUs": 2, "suspendPolicy": "CheckpointAndEvict"},
    erj.MSG_STATE_BYTES: {"minGPUs": 2, "maxGPUs": 2, "gpusPerWorker": 2, "stateBytesPerWorker": (512 << 30) + 1},
    erj.MSG_ROLES_EXCLUSIVE: {
        "minGPUs": 1,
        "maxGPUs": 2,
        "roles": {"trainer": {"workers": 1, "template": {}}, "rollout": {"maxWorkers": 2, "template": {}}},
    },
    erj.MSG_ROLES_OR_SIZE: {"minGPUs": 1},
    erj.MSG_ROLES_TIMESLICE: {
        "timesliceGroup": "g",
        "roles": {"trainer": {"workers": 1, "template": {}}, "rollout": {"maxWorkers": 2, "template": {}}},
    },
    erj.MSG_SHARE_GPW: {"minGPUs": 2, "maxGPUs": 2, "gpusPerWorker": 2, "gpuShare": {"memory": "1Gi", "compute": 5}},
    erj.MSG_SHARE_EXCLUSIVE: {
        "minGPUs": 1,
        "maxGPUs": 2,
        "timesliceGroup": "g",
        "gpuShare": {"memory": "1Gi", "compute": 5},
    },
}


def test_every_cel_rule_has_a_validator_with_its_message() -> None:
    rules = _crd_schema()["properties"]["spec"]["x-kubernetes-validations"]
    assert sorted(r["message"] for r in rules) == sorted(_CEL_VIOLATIONS)
    for message, spec in _CEL_VIOLATIONS.items():
        with pytest.raises(ValidationError, match=message):
            erj.ElasticRLJobSpec.model_validate({**spec, "template": {}} if "maxGPUs" in spec else spec)


def test_defaults_round_trip_in_camel_case() -> None:
    spec = erj.ElasticRLJobSpec.model_validate({"minGPUs": 2, "maxGPUs": 4, "template": {"spec": {}}})
    dumped = spec.model_dump(exclude_none=True)
    assert dumped["gracefulShutdownPeriod"] == 30 and dumped["minUsefulRunSeconds"] == 600
    assert (spec.min_workers, spec.max_workers) == (2, 4)


def test_whole_object_and_status_parse() -> None:
    job = erj.ElasticRLJob.model_validate(
        {
            "apiVersion": "elastic.rose.io/v1alpha1",
            "kind": "ElasticRLJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u1", "generation": 3},
            "spec": {"minGPUs": 2, "maxGPUs": 4, "template": {}},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T14:00:00Z"}],
            },
        }
    )
    assert (job.name, job.namespace, job.uid, job.generation) == ("j", "ns", "u1", 3)
    assert (job.api_version, job.kind) == (names.API_VERSION, names.KIND)
    assert job.status is not None and job.status.conditions is not None
    with pytest.raises(ValidationError, match="phase"):
        erj.ElasticRLJobStatus.model_validate({"phase": "Sleeping"})
