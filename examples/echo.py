"""Echo over polymux: a server that echoes every channel, and a client with many channels.

python examples/echo.py serve --port 9000 [--protocol mstream-v3]
python examples/echo.py client --port 9000 --channels 8
python examples/echo.py both          # both in one process, on a unix socket
"""

from __future__ import annotations

import argparse
import asyncio
import os
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
        reader, writer = await session.open_channel(f"echo/{i}")
        message = f"hello from channel {i}".encode()
        writer.write(message)
        writer.write_eof()
        reply = await reader.read()
        assert reply == message, (reply, message)
        print(f"channel {i}: {reply.decode()}")
        writer.close()

    await asyncio.gather(*(one(i) for i in range(channels)))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["serve", "client", "both"])
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--protocol", default="mstream-v3", choices=polymux.PROTOCOLS)
    parser.add_argument("--channels", type=int, default=8)
    args = parser.parse_args()
    if args.mode == "serve":
        server = await polymux.start_server(echo, "127.0.0.1", args.port, protocol=args.protocol)
        print(f"echoing {args.protocol} channels on 127.0.0.1:{server.port}")
        await server.serve_forever()
    elif args.mode == "client":
        async with await polymux.connect("127.0.0.1", args.port, protocol=args.protocol) as session:
            await client(session, args.channels)
    else:
        path = os.path.join(tempfile.mkdtemp(), "echo.sock")
        async with (
            await polymux.start_unix_server(echo, path, protocol=args.protocol),
            await polymux.connect_unix(path, protocol=args.protocol) as session,
        ):
            await client(session, args.channels)


if __name__ == "__main__":
    asyncio.run(main())
