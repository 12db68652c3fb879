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
    "inspect",
    "convert_engram",
    "generate",
    "agent",
    "serve",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-ds41", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        module = importlib.import_module(f"sglang_ds41.commands.{module_name}")
        sub = subparsers.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        # A command with PASSTHROUGH = True gets flags it does not know in `args.args` (serve
        # hands them to sglang.launch_server), wherever they stand on the command line.
        sub.set_defaults(run=module.run, passthrough=getattr(module, "PASSTHROUGH", False))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if not args.passthrough:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.args = [*args.args, *unknown]
    try:
        return args.run(args)
    except Ds41Error as error:
        print(f"sglang-ds41 {args.command}: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
