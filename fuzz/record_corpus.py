"""Record the seed corpus: valid sessions of every format, captured with
``SessionConfig(capture=...)``, written as fuzz inputs (control byte + received bytes).

    .venv/bin/python fuzz/record_corpus.py            # polymux <-> polymux, every format
    .venv/bin/python fuzz/record_corpus.py --node     # also polymux <-> the Node peers

Each session is a client (deterministic engine, see ``polymux_fuzz.new_engine``) that opens
``OPENS`` channels one after the other and drives them (echo, half-close, reset), against a
server that echoes. What the server received becomes ``server-*.bin`` (replayed by a server
engine) and what the client received ``client-*.bin`` (replayed by a client engine that
opens the same channels). Files go to ``fuzz/corpus/<format>/``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import polymux_fuzz as pf

import polymux
from polymux.aio.session import MuxProtocol


OPENS = 3
ROOT = Path(__file__).resolve().parent
NODE_DIR = ROOT.parent / "tests" / "interop" / "node"


class Recorder:
    """A capture sink that keeps what was received."""

    def __init__(self) -> None:
        self.data = bytearray()

    def received(self, data: bytes | bytearray | memoryview) -> None:
        self.data += data

    def sent(self, chunks: Sequence[bytes]) -> None:
        return

    def close(self) -> None:
        return


def _sink(store: dict[str, Recorder]):  # type: ignore[no-untyped-def]
    def factory(info: Mapping[str, str]) -> Recorder:
        rec = Recorder()
        store[info["role"]] = rec
        return rec

    return factory


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, polymux.PolymuxError):
        name = writer.get_extra_info("channel_name") or ""
        if name.startswith("error/"):
            assert isinstance(writer.transport, polymux.ChannelTransport)
            writer.transport.reset("fuzz corpus")
            return
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()


async def _drive(session: polymux.Session, sizes: Sequence[int], names: Sequence[str]) -> None:
    """Open the channels one after the other (deterministic ids), then run them at once."""
    pairs = [await session.open_channel(name) for name in names]

    async def run(i: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, polymux.PolymuxError):
            data = bytes((j * 31 + i) & 0xFF for j in range(sizes[i]))
            writer.write(data)
            await writer.drain()
            writer.write_eof()
            await reader.read()
            writer.close()
            await writer.wait_closed()

    await asyncio.gather(*(run(i, r, w) for i, (r, w) in enumerate(pairs)))


async def record_pair(fmt: str, sizes: Sequence[int]) -> tuple[bytes, bytes]:
    """One polymux client/server session over a socketpair; returns what (client,
    server) received."""
    loop = asyncio.get_running_loop()
    store: dict[str, Recorder] = {}
    cfg = pf.CONFIG.__class__.from_options(pf.CONFIG, capture=_sink(store), keepalive_interval=None)
    a, b = socket.socketpair()
    names = ["echo/0", "echo/1", "error/2"][: len(sizes)]
    _t, server = await loop.create_connection(
        lambda: MuxProtocol(
            fmt, cfg, is_client=False, handler=_echo, engine=pf.new_engine(fmt, is_client=False, config=cfg)
        ),
        sock=b,
    )
    _t2, client = await loop.create_connection(
        lambda: MuxProtocol(fmt, cfg, is_client=True, engine=pf.new_engine(fmt, is_client=True, config=cfg)),
        sock=a,
    )
    await asyncio.wait_for(client.ready, 10)
    await asyncio.wait_for(_drive(client.session, sizes, names), 30)
    await asyncio.wait_for(client.session.aclose(), 15)
    await asyncio.wait_for(server.session.wait_closed(), 15)
    return bytes(store["client"].data), bytes(store["server"].data)


async def record_node(fmt: str) -> bytes | None:
    """A polymux client against the Node responder of ``fmt``; returns what it received
    (None when there is no Node peer for the format)."""
    if fmt.startswith("mstream-v"):
        script, args = "mstream_peer.js", ["--version", fmt[-1]]
    elif fmt in ("mplex", "multiplex"):
        script, args = "mplex_peer.mjs", ["--impl", "libp2p" if fmt == "mplex" else "multiplex"]
    elif fmt == "yamux":
        script, args = "yamux_peer.mjs", []
    else:
        return None
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(NODE_DIR / script),
        *args,
        "--listen",
        "--tcp",
        "0",
        "--mode",
        "responder",
        "--timeout-ms",
        "30000",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()
        assert line[:1] == ["LISTENING"], line
        store: dict[str, Recorder] = {}
        cfg = pf.CONFIG.__class__.from_options(pf.CONFIG, capture=_sink(store), keepalive_interval=None)
        loop = asyncio.get_running_loop()
        _t, client = await loop.create_connection(
            lambda: MuxProtocol(
                fmt, cfg, is_client=True, engine=pf.new_engine(fmt, is_client=True, config=cfg)
            ),
            "127.0.0.1",
            int(line[1]),
        )
        await asyncio.wait_for(client.ready, 10)
        session = client.session
        names = ["echo/0", "halfclose/1", "error/x"]
        pairs = [await session.open_channel(name) for name in names]
        for i, (reader, writer) in enumerate(pairs):
            with contextlib.suppress(ConnectionError, polymux.PolymuxError):
                writer.write(bytes(range(256)) * (i + 1))
                writer.write_eof()
                await asyncio.wait_for(reader.read(), 10)
                writer.close()
        await asyncio.wait_for(session.aclose(), 15)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.communicate(), 30)
        return bytes(store["client"].data)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def _write(fmt: str, name: str, ctl: int, data: bytes) -> None:
    folder = ROOT / "corpus" / fmt
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(bytes([ctl]) + data)
    print(f"{fmt}/{name}: {len(data)} bytes")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--node", action="store_true", help="also record against the Node peers")
    parser.add_argument("--format", action="append", help="only these formats (repeatable)")
    args = parser.parse_args()
    for fmt in args.format or pf.FORMATS:
        for k, sizes in enumerate([(40, 700, 10), (3000, 9000, 0)]):
            client, server = await record_pair(fmt, sizes)
            # omnistreams data may only follow the reader's grant, which the replaying engine
            # gives when it sees the create: feed those sessions byte by byte.
            whole = 1 if fmt.startswith("omnistreams") else 0
            _write(fmt, f"server-{k}.bin", pf.control_byte(is_client=False, chunk=whole), server)
            _write(fmt, f"client-{k}.bin", pf.control_byte(is_client=True, opens=OPENS), client)
            # The same bytes fed in small pieces (the decoders' straddling paths).
            _write(fmt, f"server-{k}-pieces.bin", pf.control_byte(is_client=False, chunk=7), server[:4096])
        if args.node:
            data = await record_node(fmt)
            if data is not None:
                _write(fmt, "node-client-0.bin", pf.control_byte(is_client=True, opens=OPENS), data)


if __name__ == "__main__":
    asyncio.run(main())
