"""Receive files over polymux: ``polymux receive``.

    python examples/filetransfer/receive.py --protocol mstream-v3 --tcp 127.0.0.1:9000 --dest inbox/
    python examples/filetransfer/receive.py --protocol yamux --unix /tmp/ft.sock --dest inbox/

The command lives in the package (polymux.cli.receive; --help lists its options); this
script runs it. Receiving is a few lines of the API::

    from polymux.apps.filetransfer import Receiver

    receiver = Receiver(Path("inbox"))   # safe names, SHA-256, partial files kept for resume
    server = await polymux.start_server(receiver.handle, "127.0.0.1", 9000, protocol="mstream-v3")
"""

from __future__ import annotations

import sys

from polymux.cli import main


if __name__ == "__main__":
    sys.exit(main(["receive", *sys.argv[1:]]))
