"""``rose completion bash``: a bash completion script for ``rose``'s sub-commands and their flags.

Pure text generation from the sub-command table and each component's argparse parser; the only
I/O is printing the script.
"""

from __future__ import annotations

import argparse
import importlib

from rose_common.cli import EnvArgumentParser

_TEMPLATE = """# bash completion for rose (source <(rose completion bash))
_rose() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}}
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "{commands}" -- "$cur"))
    return
  fi
  case "${{COMP_WORDS[1]}}" in
{cases}
  esac
}}
complete -F _rose rose
"""


def _flags(module_name: str) -> list[str]:
    """Every option string of the module's ``build_parser()`` (and its sub-parsers); none if it has none."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return []
    build = getattr(module, "build_parser", None) or getattr(module, "_parser", None)
    if build is None:
        return []
    parser: argparse.ArgumentParser = build()
    words: set[str] = set()
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:
            words.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                words.update(action.choices)
                stack.extend(action.choices.values())
    return sorted(words)


def script(commands: dict[str, str]) -> str:
    """The completion script for ``commands`` (name → module)."""
    cases = "\n".join(
        f'    {name}) COMPREPLY=($(compgen -W "{" ".join(_flags(module))}" -- "$cur")) ;;'
        for name, module in commands.items()
    )
    return _TEMPLATE.format(commands=" ".join(commands), cases=cases)


def build_parser() -> argparse.ArgumentParser:
    p = EnvArgumentParser(prog="rose completion", description=__doc__)
    p.add_argument("shell", choices=["bash"], help="the shell to complete in")
    return p


def main(argv: list[str] | None = None) -> int:
    build_parser().parse_args(argv)
    from rose_cli.main import COMMANDS

    print(script({name: module for name, (module, _) in COMMANDS.items()}))
    return 0
