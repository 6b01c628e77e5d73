"""yamux: no window update goes out for a stream the peer has closed by the time our output
is written.

The case: we half-closed a stream, its reader consumed what the peer sent (credit is due),
but our output waits (the socket is full: we are sending a lot on another stream and the
peer is not reading). Meanwhile the peer ends the stream. hashicorp/yamux forgets a stream
closed both ways and logs "frame for missing stream" for every frame that follows, so the
update must not be written once the output moves again.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest

import polymux
from polymux.wire.yamux import Decoder, Flag, Frame, Type, encode_header

from .helpers import until


pytestmark = pytest.mark.timeout(20)
KiB = 1024
MiB = 1024 * KiB


async def test_no_window_update_for_a_stream_the_peer_closed_while_our_output_waited() -> None:
    accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put((reader, writer))

    # Small socket buffers on both ends, so that our output waits once the peer stops reading.
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * KiB)
    listener.bind(("127.0.0.1", 0))
    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        session = await asyncio.wait_for(
            polymux.connect(
                "127.0.0.1", listener.getsockname()[1], protocol="yamux", keepalive_interval=None
            ),
            5,
        )
        session.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 * KiB)
        peer_reader, peer = await asyncio.wait_for(accepted.get(), 5)
        try:
            r1, w1 = await session.open_channel()  # stream 1
            w1.write_eof()  # our FIN: the peer closes the stream both ways when it ends its side
            _r3, w3 = await session.open_channel()  # stream 3
            peer.write(
                encode_header(Type.WINDOW_UPDATE, Flag.ACK, 1, 0)
                + encode_header(Type.WINDOW_UPDATE, Flag.ACK, 3, 4 * MiB)
            )
            w3.write(bytes(2 * MiB))  # the peer does not read: our output waits
            await until(lambda: session.mux._write_paused)
            peer.write(encode_header(Type.DATA, 0, 1, 256 * KiB) + bytes(256 * KiB))
            assert len(await asyncio.wait_for(r1.readexactly(256 * KiB), 5)) == 256 * KiB
            await until(lambda: session.engine.has_output)  # the window update is due
            assert session.mux._write_paused
            peer.write(encode_header(Type.WINDOW_UPDATE, Flag.FIN, 1, 0))  # closed both ways now
            assert await asyncio.wait_for(r1.read(), 5) == b""
            # The peer reads again: everything up to the 2 MiB of stream 3.
            frames: list[Frame] = []
            decoder = Decoder(16 * MiB)
            received = 0
            while received < 2 * MiB:
                chunk = await asyncio.wait_for(peer_reader.read(256 * KiB), 5)
                assert chunk, "polymux closed the connection"
                for frame in decoder.feed(chunk):
                    frames.append(frame._replace(body=b""))
                    if frame.type == Type.DATA and frame.stream_id == 3:
                        received += frame.length
            updates = [f for f in frames if f.stream_id == 1 and f.type == Type.WINDOW_UPDATE and f.length]
            assert updates == [], "a window update for a stream the peer had closed"
        finally:
            session.abort()
            peer.close()
            with contextlib.suppress(ConnectionError):
                await peer.wait_closed()
