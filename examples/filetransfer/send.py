"""Send files over polymux: ``polymux send``.

    python examples/filetransfer/send.py --protocol mstream-v3 --tcp 127.0.0.1:9000 photos/ notes.txt
    python examples/filetransfer/send.py --protocol yamux --unix /tmp/ft.sock big.iso --as backups/big.iso

The command lives in the package (polymux.cli.send; --help lists its options); this script
runs it. Sending is a few lines of the API::

    from polymux.apps.filetransfer import collect, send_files

    session = await polymux.connect("127.0.0.1", 9000, protocol="mstream-v3")
    transfers = collect([Path("photos")])
    await send_files(session, transfers, parallel=8)   # one channel per file, SHA-256, resume
"""

from __future__ import annotations

import sys

from polymux.cli import main


if __name__ == "__main__":
    sys.exit(main(["send", *sys.argv[1:]]))
