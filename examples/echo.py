"""Echo over polymux: a server that echoes every channel, and a client with many channels.

python examples/echo.py serve --port 9000 [--protocol mstream-v3]
python examples/echo.py client --port 9000 --channels 8
python examples/echo.py both          # both in one process, on a unix socket

Every format works, omnistreams too: its streams are one-way, and open_pair() opens one
each way (on the other formats it is open_channel()). Exit status as every polymux
command: 0 ok, 1 an echo failed, 2 bad arguments, 3 no session (nothing listens there, or
the peer speaks another format), 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile

import polymux


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echo everything until the peer half-closes, then half-close too."""
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def client(session: polymux.Session, channels: int) -> None:
    async def one(i: int) -> None:
        reader, writer = await session.open_pair(f"echo/{i}")  # a channel both ways, any format
        message = f"hello from channel {i}".encode()
        writer.write(message)
        writer.write_eof()
        reply = await reader.read()
        if reply != message:
            raise polymux.ProtocolError(session.protocol, f"channel {i} echoed {reply!r}, not {message!r}")
        print(f"channel {i}: {reply.decode()}")
        writer.close()

    await asyncio.gather(*(one(i) for i in range(channels)))


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["serve", "client", "both"])
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--protocol", default="mstream-v3", choices=polymux.PROTOCOLS)
    parser.add_argument("--channels", type=int, default=8)
    args = parser.parse_args()
    if args.mode == "serve":
        try:
            server = await polymux.start_server(echo, "127.0.0.1", args.port, protocol=args.protocol)
        except OSError as exc:
            print(f"echo: cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"echoing {args.protocol} channels on 127.0.0.1:{server.port}", flush=True)
        await server.serve_forever()
        return 0
    try:
        if args.mode == "client":
            session = await polymux.connect("127.0.0.1", args.port, protocol=args.protocol)
        else:
            path = os.path.join(tempfile.mkdtemp(), "echo.sock")
            server = await polymux.start_unix_server(echo, path, protocol=args.protocol)
            session = await polymux.connect_unix(path, protocol=args.protocol)
    except (OSError, polymux.PolymuxError) as exc:  # refused, or the handshake failed
        print(f"echo: no {args.protocol} session: {exc}", file=sys.stderr)
        return 3
    try:
        async with session:
            await client(session, args.channels)
    except (OSError, polymux.PolymuxError) as exc:
        print(f"echo: failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.mode == "both":
            server.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except KeyboardInterrupt:
        sys.exit(130)
