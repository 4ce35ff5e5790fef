"""rose_common.runner: start failures are one line and exit 2, stop callbacks run once, the
runner's threads are joined within its bound (and the ones that are not are named), and every
component's flag and kubeconfig errors are one line (each component's real ``main``)."""

from __future__ import annotations

import argparse
import importlib
import logging
import threading
import time
from pathlib import Path

import pytest

from rose_common import runner
from rose_common.cli import EnvArgumentParser, port


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**kw)


def test_start_error_and_message_exits_are_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ROSE_DEBUG", raising=False)

    def fails(args: argparse.Namespace, r: runner.Runner) -> int:
        raise runner.StartError("--thing x: no such\n  file; give another")

    assert runner.run("rose t", _args, fails) == 2
    assert capsys.readouterr().err == "rose t: --thing x: no such file; give another\n"

    def exits(args: argparse.Namespace, r: runner.Runner) -> int:
        raise SystemExit("rose t: --flag: bad value")

    assert runner.run("rose t", _args, exits) == 2
    assert capsys.readouterr().err == "rose t: --flag: bad value\n"

    def usage(args: argparse.Namespace, r: runner.Runner) -> int:
        raise SystemExit(3)  # a numeric exit is the component's own documented code

    with pytest.raises(SystemExit) as e:
        runner.run("rose t", _args, usage)
    assert e.value.code == 3


def test_stop_callbacks_run_once_in_order_and_threads_are_joined() -> None:
    calls: list[str] = []
    seen: list[threading.Thread] = []

    def body(args: argparse.Namespace, r: runner.Runner) -> int:
        r.on_stop(lambda: calls.append("a"))
        r.on_stop(lambda: calls.append("b"))
        seen.append(r.thread(lambda stop: stop.wait(), "waits-for-stop"))
        r.request_stop()  # what SIGTERM does
        assert r.stop.wait(5)
        return 7

    assert runner.run("rose t", _args, body) == 7
    assert calls == ["a", "b"]
    assert not seen[0].is_alive()


def test_a_thread_that_ignores_stop_is_named_after_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    r = runner.Runner("rose t", join_timeout_s=0.2)
    release = threading.Event()
    r.thread(lambda stop: release.wait(10), "stubborn")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rose_common.runner"):
        assert r.shutdown() == ["stubborn"]
    assert time.monotonic() - started < 5
    assert any(rec.getMessage() == "threads left at exit" for rec in caplog.records)
    release.set()


def test_a_failing_stop_callback_does_not_stop_the_others() -> None:
    r = runner.Runner("rose t")
    done: list[int] = []
    r.on_stop(lambda: 1 / 0)
    r.on_stop(lambda: done.append(1))
    assert r.shutdown() == []
    assert done == [1]


def test_kubeconfig_problems_name_the_flag_and_the_variable(tmp_path: Path) -> None:
    with pytest.raises(runner.StartError, match=r"^--kubeconfig /nope: no such file; .*\(or set ROSE_X_KUBECONFIG\)$"):
        runner.kube_client("/nope", env="ROSE_X_KUBECONFIG")
    bad = tmp_path / "kc"
    bad.write_text("clusters: [\n")
    with pytest.raises(runner.StartError, match=rf"^cannot load --kubeconfig {bad}: .*valid kubeconfig$"):
        runner.kube_client(str(bad), env="ROSE_X_KUBECONFIG")


def test_flag_errors_are_one_line_with_a_help_hint_unless_the_type_said_what_is_allowed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    p = EnvArgumentParser(prog="rose t")
    p.flag("--n", type=int, default=1, help="n")
    p.flag("--p", type=port, default=1, help="p")
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--nope"])
    assert e.value.code == 2
    assert capsys.readouterr().err == "rose t: error: unrecognized arguments: --nope (see `rose t --help`)\n"
    with pytest.raises(SystemExit):
        p.parse_args(["--n", "x"])
    assert capsys.readouterr().err == "rose t: error: argument --n: invalid int value: 'x' (see `rose t --help`)\n"
    with pytest.raises(SystemExit):
        p.parse_args(["--p", "x"])
    assert capsys.readouterr().err == "rose t: error: argument --p: not a port: 'x': use 1..65535\n"


# every component's real entry point: (command, its module, the arguments that reach the kube client)
COMPONENTS = {
    "extender": ("scheduler_extender.cli", ["--forecast-backend", "none", "--listen", "127.0.0.1:0"]),
    "controller": ("elastic_controller.cli", ["--forecast-backend", "none", "--metrics-listen", "127.0.0.1:0"]),
    "driver": ("dra_driver.cli", ["--node-name", "n", "--gpu-backend", "simulated", "--metrics-port", "-1"]),
    "timeslice": ("timeslice.cli", ["serve", "--store", "kubernetes", "--insecure", "--listen", "127.0.0.1:0"]),
    "agent": ("dra_driver.agent.cli", []),
    "predictor": ("predictor.cli", ["serve", "--pools", "p.yaml"]),
}


@pytest.mark.parametrize("command", sorted(COMPONENTS))
def test_a_flag_error_is_one_line_for_every_component(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    module_name, args = COMPONENTS[command]
    main = importlib.import_module(module_name).main
    with pytest.raises(SystemExit) as e:
        main([*args, "--no-such-flag"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "error: unrecognized arguments: --no-such-flag (see `rose" in err and "usage:" not in err


@pytest.mark.parametrize("command", ["controller", "driver", "extender", "timeslice"])
def test_a_bad_kubeconfig_is_one_line_for_every_component_that_needs_one(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    module_name, args = COMPONENTS[command]
    main = importlib.import_module(module_name).main
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [\n")
    for kubeconfig in (str(tmp_path / "missing"), str(bad)):
        assert main([*args, "--kubeconfig", kubeconfig]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("{")]  # not JSON logs
        assert len(lines) == 1 and kubeconfig in lines[0] and "--kubeconfig" in lines[0], lines
        assert lines[0].startswith(f"rose {command}")


def test_every_rose_command_answers_a_flag_error_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Through the ``rose`` dispatcher, as a user types it; an unknown command is one line too."""
    from rose_cli.main import COMMANDS
    from rose_cli.main import main as rose

    several: list[str] = []
    for command in sorted(COMMANDS):
        args = {"predictor": ["serve"], "timeslice": ["serve"], "dashboard": ["check"], "completion": ["bash"]}
        with pytest.raises(SystemExit) as e:
            rose([command, *args.get(command, []), "--no-such-flag"])
        err = capsys.readouterr().err
        assert e.value.code == 2, (command, err)
        if len(err.strip().splitlines()) != 1 or "usage:" in err:
            several.append(f"{command}: {err}")
    assert not several, several
    assert rose(["no-such-command"]) == 2
    assert capsys.readouterr().err == "rose: error: unknown command 'no-such-command' (see `rose --help`)\n"


def test_rose_debug_puts_the_traceback_before_the_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails(args: argparse.Namespace, r: runner.Runner) -> int:
        raise runner.StartError("--x: bad")

    monkeypatch.setenv("ROSE_DEBUG", "1")
    assert runner.run("rose t", _args, fails) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1] == "rose t: --x: bad"
