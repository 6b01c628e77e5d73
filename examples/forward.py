"""Port forwarding with the library: what ``polymux forward`` runs, in one program.

python examples/forward.py [--protocol yamux]

It starts a little web server (the target), a far end that may connect to it, and a near
end with one forward of each kind, then fetches the page three ways: through -L (a local
port), through -D (SOCKS5, as curl --socks5-hostname would) and through -R (a port the far
end listens on, carried back to the near end). Over TCP here; a unix socket, TLS
(``ssl=``) or a WebSocket (``ws://``) take the same calls. Exit status as every polymux
command: 0 ok, 1 a fetch failed, 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import polymux
from polymux.forward import start_far_end, start_near_end


PAGE = b"hello through polymux forward\n"


async def web(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The target: one page to any request."""
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE))
    writer.close()


async def fetch(port: int, socks_to: tuple[str, int] | None = None) -> bytes:
    """GET / from 127.0.0.1:port (through a SOCKS5 proxy there, to ``socks_to``)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if socks_to is not None:
        host, target = socks_to
        writer.write(b"\x05\x01\x00")  # SOCKS5, one method: no authentication
        await reader.readexactly(2)
        writer.write(b"\x05\x01\x00\x03" + bytes([len(host)]) + host.encode() + target.to_bytes(2, "big"))
        reply = await reader.readexactly(10)
        if reply[1] != 0:
            raise OSError(f"SOCKS5 reply {reply[1]}")
    writer.write(b"GET / HTTP/1.0\r\n\r\n")
    writer.write_eof()  # the request is all sent: the answer still comes back (half-close)
    answer = await reader.read()
    writer.close()
    return answer.partition(b"\r\n\r\n")[2]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default="yamux", choices=polymux.PROTOCOLS)
    args = parser.parse_args()
    target = await asyncio.start_server(web, "127.0.0.1", 0)
    port = target.sockets[0].getsockname()[1]
    # The far end: connects channels to targets its rules allow (nothing, without them).
    far = await start_far_end(f"{args.protocol}:tcp:127.0.0.1:0", allow=[f"localhost:{port}"], reverse=True)
    # The near end: ssh's -L, -D and -R, over one session with the far end.
    near = await start_near_end(
        f"{args.protocol}:tcp:127.0.0.1:{far.endpoint.port}",
        local=[f"0:localhost:{port}"],
        socks=["0"],
        remote=[f"0:127.0.0.1:{port}"],
    )
    try:
        local, remote, socks = near.forwards
        for forward in near.forwards:
            print(f"listening {forward}")
        pages = {
            "-L": await fetch(local.bind.port),
            "-D": await fetch(socks.bind.port, ("localhost", port)),
            "-R": await fetch(remote.bind.port),
        }
    finally:
        await near.aclose()
        await far.aclose()
        target.close()
    for kind, page in pages.items():
        print(f"{kind}: {page.decode().strip()}")
    print(f"{near.stats.total} connections, {near.stats.bytes_back} bytes back, one {args.protocol} session")
    return 0 if all(page == PAGE for page in pages.values()) else 1


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except KeyboardInterrupt:
        sys.exit(130)
