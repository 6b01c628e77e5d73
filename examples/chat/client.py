"""The chat's terminal client: ``polymux chat``.

    python examples/chat/client.py --protocol mstream-v3 --tcp 127.0.0.1:9000 --nick ada --room lobby

The command lives in the package (polymux.cli.chat; --help lists its options); this script
runs it. A client is a few lines of the API::

    session = await polymux.connect("127.0.0.1", 9000, protocol="mstream-v3")
    client = polymux.apps.chat.ChatClient(session, "ada")
    await client.join("lobby")
    await client.say("lobby", "hello")
    print(await client.read("lobby"))  # {'type': 'msg', 'nick': 'ada', 'text': 'hello', ...}
"""

from __future__ import annotations

import sys

from polymux.cli import main


if __name__ == "__main__":
    sys.exit(main(["chat", *sys.argv[1:]]))
