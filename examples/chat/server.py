"""The chat server: ``polymux chat --server`` (and, with --web, ``polymux webchat``).

    python examples/chat/server.py --protocol mstream-v3 --tcp 127.0.0.1:9000 --unix /tmp/chat.sock
    python examples/chat/server.py --protocol mstream-v3 --tcp 127.0.0.1:9000 --web 127.0.0.1:8000

The command lives in the package (polymux.cli.chat; --help lists its options); this script
runs it. The server itself is a few lines of the API::

    chat = polymux.apps.chat.ChatServer(queue_size=256, policy="disconnect")
    server = await polymux.start_server(chat.handle, "127.0.0.1", 9000, protocol="mstream-v3")
"""

from __future__ import annotations

import sys

from polymux.cli import main


if __name__ == "__main__":
    sys.exit(main(["chat", "--server", *sys.argv[1:]]))
