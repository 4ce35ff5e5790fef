"""Command-line flags with environment twins, and the value types every component's flags share.

Pure argparse; the only I/O is reading ``os.environ`` when the arguments are parsed.

:class:`EnvArgumentParser` gives every flag added through :meth:`EnvArgumentParser.flag` an
environment twin (``<prefix><FLAG>``: upper case, dashes as underscores), named in ``--help``.
An environment value is parsed exactly like the same value on the command line: through the
flag's ``type`` and ``choices``, and an invalid one is refused with a message that names the
variable, the value and what is allowed. The command line wins over the environment; a
required flag is satisfied by its twin.

The shared value types: :func:`port` (1-65535; :func:`port_type` for flags where 0 or -1 has
a meaning), :func:`host_port` (``HOST:PORT``), :func:`byte_size` (a Kubernetes quantity of
bytes: ``64Gi``, ``500M``, ``1073741824``), :func:`duration` (seconds: ``0.5``, ``30s``,
``5m``, ``1h``, ``500ms``) and :func:`boolean` (``true`` / ``false``).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from rose_common.quantity import QuantityError, parse_quantity

__all__ = [
    "EnvArgumentParser",
    "boolean",
    "byte_size",
    "duration",
    "env_name",
    "host_port",
    "port",
    "port_type",
]

MAX_PORT = 65535


def env_name(prefix: str, flag: str) -> str:
    """``("ROSE_DRIVER_", "--publish-slices")`` → ``ROSE_DRIVER_PUBLISH_SLICES``."""
    return prefix + flag.lstrip("-").upper().replace("-", "_")


class EnvArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose :meth:`flag` arguments also read an environment variable.

    Sub-parsers made with ``add_subparsers().add_parser(...)`` are of this class too and take
    the prefix of their parent unless given their own ``env_prefix``.
    """

    def __init__(self, *args: Any, env_prefix: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env_prefix = env_prefix
        self._env_twins: list[tuple[argparse.Action, str]] = []
        self._guided = False

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", functools.partial(EnvArgumentParser, env_prefix=self.env_prefix))
        return super().add_subparsers(**kwargs)

    def flag(self, name: str, *, help: str, env: str | None = None, **kwargs: Any) -> argparse.Action:
        """``add_argument(name, ...)`` with an environment twin (default ``<prefix><FLAG>``)."""
        var = env or env_name(self.env_prefix, name)
        default = kwargs.get("default")
        shown = "" if default is None or default == "" or kwargs.get("required") else f"; default {default!r}"
        action = self.add_argument(name, help=f"{help} [env {var}{shown}]", **kwargs)
        self._env_twins.append((action, var))
        return action

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        namespace = namespace if namespace is not None else argparse.Namespace()
        for action, var in self._env_twins:
            raw = os.environ.get(var)
            if raw is not None:
                setattr(namespace, action.dest, self._env_value(action, var, raw))
                action.required = False
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        """One line, ``<prog>: error: <message>``, and exit status 2 (argparse prints its whole usage).

        A value refused by one of the flag's own types already says what is allowed; argparse's own
        complaints (an unknown flag, a missing one, a bad choice) get a pointer to ``--help``.
        """
        hint = "" if self._guided else f" (see `{self.prog} --help`)"
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}{hint}\n")

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as e:
            self._guided = isinstance(e.__context__, argparse.ArgumentTypeError)
            raise

    def _env_value(self, action: argparse.Action, var: str, raw: str) -> Any:
        """``raw`` through the flag's ``type`` and ``choices``, as argparse does for the command line."""
        try:
            value = self._get_value(action, raw)
            self._check_value(action, value)
        except argparse.ArgumentError as e:
            self.error(f"environment variable {var}={raw!r}: {e}")
        return value


# ---------------------------------------------------------------------- value types


def port_type(minimum: int = 1, meaning: str = "") -> Callable[[str], int]:
    """A port type accepting ``minimum``..65535; ``meaning`` explains the values below 1."""
    extra = f" ({meaning})" if meaning else ""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if not minimum <= value <= MAX_PORT:
            raise argparse.ArgumentTypeError(f"not a port: {text!r}: use {minimum}..{MAX_PORT}{extra}")
        return value

    parse.__name__ = "port"
    return parse


port = port_type(1)
"""A TCP port, 1-65535."""


def host_port(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` → ``(host, port)``; an empty host means ``0.0.0.0``, port 0 an ephemeral one."""
    host, sep, number = text.rpartition(":")
    if not sep or not number.isdigit() or int(number) > MAX_PORT:
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r} (example: 0.0.0.0:8080; port 0..{MAX_PORT})")
    return host or "0.0.0.0", int(number)


def byte_size(text: str) -> int:
    """A Kubernetes quantity of bytes (``64Gi``, ``500M``, ``1073741824``) → bytes, rounded up."""
    try:
        value = parse_quantity(text)
    except QuantityError as e:
        raise argparse.ArgumentTypeError(f"{e} (examples: 1073741824, 64Gi, 500M)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"negative byte size: {text!r}")
    return math.ceil(value)


_DURATION = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)?$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def duration(text: str) -> float:
    """Non-negative seconds: a bare number (``0.5``) or one with a unit (``500ms``, ``30s``, ``5m``, ``1h``, ``1d``)."""
    m = _DURATION.match(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (examples: 0.5, 30s, 5m, 1h, 500ms)")
    return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]


def boolean(text: str) -> bool:
    """``true`` → True, ``false`` → False (any case); nothing else."""
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"not a boolean: {text!r} (use true or false)")
    return lowered == "true"
