"""Paths of the repository's manifests that tests of several packages read."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_RULES = REPO / "manifests" / "prometheus" / "rules.yaml"  # the recording and alerting rules
