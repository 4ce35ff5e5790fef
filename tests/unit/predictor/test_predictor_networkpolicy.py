"""The predictor's NetworkPolicy (issue 22 §5): it selects the predictor's pods, is in the
kustomization, and admits on the serving port only the pods that read forecasts (the controller,
the rose-scheduler pod whose extender reads them) and Prometheus — by the labels those
Deployments really carry, so a relabel that would lock a client out fails here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"


def _load(path: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((MANIFESTS / path).read_text())
    return doc


def _pod_labels(path: str) -> dict[str, str]:
    labels: dict[str, str] = _load(path)["spec"]["template"]["metadata"]["labels"]
    return labels


def test_the_predictor_admits_only_its_clients_and_prometheus() -> None:
    np = _load("predictor/networkpolicy.yaml")
    assert "networkpolicy.yaml" in _load("predictor/kustomization.yaml")["resources"]
    assert np["spec"]["policyTypes"] == ["Ingress"]
    selected = np["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= _pod_labels("predictor/deployment.yaml").items()
    (rule,) = np["spec"]["ingress"]
    port = _load("predictor/deployment.yaml")["spec"]["template"]["spec"]["containers"][0]["ports"][0]
    assert rule["ports"] == [{"protocol": "TCP", "port": port["containerPort"]}]
    same_ns = [p["podSelector"]["matchLabels"] for p in rule["from"] if "namespaceSelector" not in p]
    assert same_ns == [
        {"app.kubernetes.io/name": _pod_labels("controller/deployment.yaml")["app.kubernetes.io/name"]},
        {"app.kubernetes.io/name": _pod_labels("extender/deployment.yaml")["app.kubernetes.io/name"]},
    ]
    (prom,) = [p for p in rule["from"] if "namespaceSelector" in p]
    assert prom["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
