"""manifests/timeslice: every env value parses as its flag, and every ROSE_TIMESLICE_* is a flag."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from timeslice.cli import build_parser

DIR = Path(__file__).resolve().parents[3] / "manifests" / "timeslice"


def _env() -> list[dict[str, str]]:
    docs = [d for d in yaml.safe_load_all((DIR / "deployment.yaml").read_text()) if d]
    return [e for c in docs[0]["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])]


def test_env_values_parse_and_name_real_flags(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    for e in _env():
        monkeypatch.setenv(e["name"], str(e.get("value", "from-the-downward-api")))
        if e["name"].startswith("ROSE_TIMESLICE_"):
            assert f"env {e['name']}" in helptext, e["name"]
    args = build_parser().parse_args(["serve"])
    assert (args.authenticate, args.store, args.leader_elect) == ("tokenreview", "kubernetes", True)


def test_kustomization_lists_every_file() -> None:
    kust = yaml.safe_load((DIR / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in DIR.glob("*.yaml") if p.name != "kustomization.yaml")
