"""The `sglang-ds41` command: one subcommand per module in `sglang_ds41.commands`.

Each command module defines `NAME`, `HELP`, `add_arguments(parser)` and `run(args) -> int`,
and imports its heavy dependencies inside `run`, so `sglang-ds41 --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sglang_ds41.errors import Ds41Error

COMMAND_MODULES = [
    "render",
    "parse",
    "engram_plan",
    "make_tiny",
    "train_tiny",
    "inspect",
    "convert_engram",
    "generate",
    "agent",
    "serve",
]


class VersionAction(argparse.Action):
    """`--version`: sglang-ds41's version and the sglang / torch it would serve with (metadata only)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(
            option_strings, dest, nargs=0, default=default, help=help or "print versions and exit"
        )

    def __call__(self, parser, namespace, values, option_string=None):
        from sglang_ds41.serve.launcher import versions

        print(versions())
        parser.exit()


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="sglang-ds41", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=VersionAction)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    passthrough: dict[str, argparse.ArgumentParser] = {}
    for module_name in COMMAND_MODULES:
        module = importlib.import_module(f"sglang_ds41.commands.{module_name}")
        sub = subparsers.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
        if getattr(module, "PASSTHROUGH", False):
            passthrough[module.NAME] = sub
    return parser, passthrough


def split_passthrough(sub: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """A PASSTHROUGH command's own options (with their values) vs everything else, in order.

    Lets `serve --tiny --port 8000` hand `--port 8000` to SGLang while `--tiny` stays ours;
    everything after a bare `--` is passed through untouched.
    """
    own_options = {opt: action for action in sub._actions for opt in action.option_strings}
    own: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            rest.extend(argv[i + 1 :])
            break
        action = own_options.get(token.split("=", 1)[0])
        if action is None:
            rest.append(token)
        else:
            own.append(token)
            if "=" not in token and action.nargs != 0 and i + 1 < len(argv):
                i += 1
                own.append(argv[i])
        i += 1
    return own, rest


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, passthrough = build_parser()
    if argv and argv[0] in passthrough:
        # Such a command's positional `args` collects what it passes on (see split_passthrough).
        own, rest = split_passthrough(passthrough[argv[0]], argv[1:])
        args = parser.parse_args([argv[0], *own])
        args.args = rest
    else:
        args = parser.parse_args(argv)
    try:
        return args.run(args)
    except Ds41Error as error:
        print(f"sglang-ds41 {args.command}: error: {error}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        from sglang_ds41.install import missing_module_hint

        hint = missing_module_hint(error.name)
        if hint is None:
            raise
        print(f"sglang-ds41 {args.command}: error: {hint}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
