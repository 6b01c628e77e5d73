"""The ``polymux`` command. Each subcommand is a module of this package with
``register(subparsers)``, which adds its parser and sets ``func`` (``func(args) -> int``).
Modules import heavy dependencies (pyspark, dpkt, rich) inside ``func``, so ``--help``
and the other subcommands stay fast and work without the extras. Every parser ends its
help with the same exit-status table (:data:`polymux.apps.common.EXIT_STATUS`); help texts
are plain text (no reST markup), since ``--help`` prints them as they are."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from polymux._extras import missing_extra
from polymux._version import __version__
from polymux.apps.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_STATUS


__all__ = ["main"]

_SUBCOMMANDS = (
    "webchat",
    "chat",
    "send",
    "receive",
    "demo",
    "serve",
    "connect",
    "bridge",
    "forward",
    "decode",
    "bench",
    "analyze",
)


def _version() -> str:
    from polymux import _speedups

    return f"polymux {__version__}, data plane: {_speedups.path()}"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="polymux",
        description="Many byte channels over one connection, in real multiplexing formats.",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-V",
        "--version",
        action="version",
        version=_version(),
        help="print polymux's version and the path its data plane runs on, and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _SUBCOMMANDS:
        try:
            module = importlib.import_module(f"polymux.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"polymux.cli.{name}":
                raise
            continue  # not built yet
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``polymux`` command; return its exit status (the table in every ``--help``).

    Ctrl-C ends it with 130 and one line; a module of an extra that is not installed
    (pyarrow, dpkt, websockets ...) with 1 and one line naming the extra to install."""
    args = build_parser().parse_args(argv)
    try:
        result: int = args.func(args)
    except KeyboardInterrupt:  # Ctrl-C: no traceback, the shell's status for SIGINT
        print(f"polymux {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ModuleNotFoundError as exc:
        line = missing_extra(exc)
        if line is None:
            raise  # not an extra: a broken installation, whose traceback says more
        print(f"polymux {args.command}: {line}", file=sys.stderr)
        return EXIT_FAILED
    return result
