"""polymux webchat: the chat in a web page. One server for browsers and terminals: it
serves the page and its WebSocket (omnistreams) on --web (default 127.0.0.1:8000) and takes
terminal clients (polymux chat) on --tcp (default 127.0.0.1:9000, in --protocol, default
mstream-v3); the first lines say the URL to open and the command that joins from a
terminal. Both meet in the same rooms.

Drop files on the page to upload them; the list of files on the server, live in every open
page, has download links; each transfer runs on its own channel of the page's one
WebSocket, with a progress bar driven by credit. Uploads are kept in --files DIR (default:
the folder webchat-files of $XDG_DATA_HOME/polymux, i.e. ~/.local/share/polymux/, the same
folder at every start); /stats.json shows the rooms and the downloads in progress. The
page, its data and its WebSocket answer only requests sent to localhost, a loopback address
or the address the server listens on (against DNS rebinding); --allow-host NAME adds a name
(repeatable), e.g. the machine's name on the LAN.

Needs the apps and websockets extras (pip install 'polymux[apps,websockets]'). Ctrl-C or
SIGTERM stops it (exit 0); a server that cannot listen exits 1.
"""

from __future__ import annotations

import argparse

from polymux._extras import require
from polymux.apps.common import (
    EXIT_STATUS,
    add_session_options,
    check_session_options,
    run as run_loop,
    session_options,
)
from polymux.cli.chat import (
    DEFAULT_PROTOCOL,
    DEFAULT_TCP,
    add_server_options,
    check_server_args,
    run_server,
)


__all__ = ["DEFAULT_WEB", "register", "run"]

DEFAULT_WEB = "127.0.0.1:8000"
"""Where ``polymux webchat`` serves its page unless told otherwise."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``polymux webchat``."""
    parser = sub.add_parser(
        "webchat",
        help="the chat in a web page, for browsers and terminals (prints the URL to open)",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_session_options(parser, default=DEFAULT_PROTOCOL)
    parser.add_argument(
        "--tcp",
        metavar="HOST:PORT",
        default=DEFAULT_TCP,
        help=f"take terminal clients (polymux chat) there (default {DEFAULT_TCP}; port 0: any free port)",
    )
    parser.add_argument("--unix", metavar="PATH", help="take terminal clients on this unix socket too")
    add_server_options(parser, web_default=DEFAULT_WEB)
    parser.set_defaults(func=run, parser=parser)


def run(args: argparse.Namespace) -> int:
    """Run ``polymux webchat``."""
    check_server_args(args.parser, args)
    try:
        check_session_options(args.protocol, session_options(args))
    except (ValueError, TypeError) as exc:
        args.parser.error(str(exc))
    require("websockets", "polymux webchat")  # before listening: one line, not a half-started server
    return run_loop(run_server(args), use_uvloop=args.uvloop)
