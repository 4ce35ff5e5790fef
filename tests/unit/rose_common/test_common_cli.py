"""rose_common.cli: environment twins parsed exactly like the command line; the shared value types."""

from __future__ import annotations

import argparse

import pytest

from rose_common.cli import EnvArgumentParser, boolean, byte_size, duration, env_name, host_port, port, port_type


def _parser() -> EnvArgumentParser:
    p = EnvArgumentParser(prog="t", env_prefix="T_")
    p.flag("--mode", help="a choice", choices=["a", "b"], default="a")
    p.flag("--size", help="bytes", type=byte_size, default="1Ki")
    p.flag("--name", help="required", required=True)
    return p


def test_env_name() -> None:
    assert env_name("ROSE_DRIVER_", "--publish-slices") == "ROSE_DRIVER_PUBLISH_SLICES"
    assert env_name("X_", "node-name") == "X_NODE_NAME"


def test_env_twin_sets_converts_and_satisfies_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T_NAME", "n1")
    monkeypatch.setenv("T_SIZE", "2Gi")
    monkeypatch.setenv("T_MODE", "b")
    a = _parser().parse_args([])
    assert (a.name, a.size, a.mode) == ("n1", 2 * 2**30, "b")
    a = _parser().parse_args(["--mode", "a", "--size", "3k", "--name", "cli"])
    assert (a.name, a.size, a.mode) == ("cli", 3000, "a"), "the command line wins"


def test_string_default_goes_through_type() -> None:
    assert _parser().parse_args(["--name", "x"]).size == 1024


@pytest.mark.parametrize(
    ("var", "value", "needles"),
    [
        ("T_MODE", "c", ["T_MODE='c'", "invalid choice", "'a', 'b'"]),
        ("T_SIZE", "64K", ["T_SIZE='64K'", "unknown suffix 'K'", "Ki"]),
    ],
)
def test_invalid_env_value_is_refused_naming_variable_value_and_allowed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], var: str, value: str, needles: list[str]
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(["--name", "x"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    for needle in needles:
        assert needle in err, (needle, err)


def test_help_names_the_twin(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--help"])
    out = capsys.readouterr().out.replace("\n", " ").replace(" ", "")
    assert "[envT_MODE;default'a']" in out and "[envT_NAME]" in out


def test_subparsers_inherit_the_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    p = EnvArgumentParser(prog="t", env_prefix="T_")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up").flag("--nodes", help="n", type=int, default=1)
    monkeypatch.setenv("T_NODES", "7")
    assert p.parse_args(["up"]).nodes == 7
    monkeypatch.setenv("T_NODES", "seven")
    with pytest.raises(SystemExit):
        p.parse_args(["up"])


def test_value_types() -> None:
    assert port("1") == 1 and port("65535") == 65535
    for bad in ("0", "65536", "-1", "http"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"1\.\.65535"):
            port(bad)
    assert port_type(-1, "-1: off")("-1") == -1
    with pytest.raises(argparse.ArgumentTypeError, match=r"-1: off"):
        port_type(-1, "-1: off")("-2")
    assert host_port("127.0.0.1:0") == ("127.0.0.1", 0) and host_port(":8080") == ("0.0.0.0", 8080)
    for bad in ("8080", "h:x", "h:70000"):
        with pytest.raises(argparse.ArgumentTypeError, match="HOST:PORT"):
            host_port(bad)
    assert byte_size("64Gi") == 64 * 2**30 and byte_size("500M") == 500 * 10**6 and byte_size("1.5Ki") == 1536
    assert byte_size("0.5") == 1, "a fraction of a byte rounds up, like Quantity.Value()"
    for bad in ("lots", "-1Gi", "64K"):
        with pytest.raises(argparse.ArgumentTypeError):
            byte_size(bad)
    assert duration("0.5") == 0.5 and duration("30s") == 30 and duration("5m") == 300
    assert duration("1h") == 3600 and duration("500ms") == 0.5 and duration("1d") == 86400
    for bad in ("-1", "5 minutes", "1w", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
            duration(bad)
    assert boolean("true") is True and boolean("False") is False
    for bad in ("yes", "1", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="true or false"):
            boolean(bad)


@pytest.mark.parametrize(
    ("manifest", "module", "argv"),
    [
        ("driver/daemonset.yaml", "dra_driver.cli", []),
        ("extender/deployment.yaml", "scheduler_extender.cli", []),
        ("predictor/deployment.yaml", "predictor.cli", ["serve"]),
    ],
)
def test_shipped_manifests_set_valid_environment_values(
    monkeypatch: pytest.MonkeyPatch, manifest: str, module: str, argv: list[str]
) -> None:
    """Every literal env value in the shipped manifests parses as its flag (a typo would stop the pod)."""
    import importlib
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[3] / "manifests"
    docs = [
        d
        for d in yaml.safe_load_all((root / manifest).read_text())
        if d and d.get("kind") in ("DaemonSet", "Deployment")
    ]
    env = [e for c in docs[0]["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])]
    literal = {e["name"]: str(e["value"]) for e in env if "value" in e}
    assert literal
    for name, value in literal.items():
        monkeypatch.setenv(name, value)
    for e in env:
        if "valueFrom" in e:
            monkeypatch.setenv(e["name"], "from-the-downward-api")
    mod = importlib.import_module(module)
    parser = mod.build_parser() if hasattr(mod, "build_parser") else mod._parser()
    parser.parse_args(argv)
