"""Every format, the library's ends in this process: -L, bare -L, -R and -D, a client that
half-closes and still gets the whole answer, a refused target, 64 MiB through one
connection and 256 connections at once, every byte checked by SHA-256. One far end and
one near end per format carry all of it (a second pair for bare channels, whose far end
has --to)."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

import polymux
from polymux.forward import Reply

from .helpers import (
    MIB,
    closed_port,
    ends,
    exchange,
    hash_answer,
    pattern,
    socks_connect,
    socks_exchange,
    target_server,
)


pytestmark = pytest.mark.timeout(120)

CONNECTIONS = 256
EACH = 16 * 1024


async def _many(port: int) -> None:
    """CONNECTIONS connections open at once, each an echo of its own EACH bytes."""
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(CONNECTIONS)]

    async def one(i: int) -> None:
        reader, writer = conns[i]
        payload = pattern(EACH, seed=i)
        writer.write(b"echo\n" + payload)
        writer.write_eof()
        got = await reader.read(-1)
        writer.close()
        assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest(), f"connection {i}"

    await asyncio.gather(*(one(i) for i in range(CONNECTIONS)))


@pytest.mark.parametrize("protocol", polymux.PROTOCOLS)
async def test_every_forward_on_every_format(protocol: str) -> None:
    async with target_server() as port:
        refused = closed_port()
        async with ends(
            protocol,
            local=(f"0:127.0.0.1:{port}", f"0:127.0.0.1:{refused}"),
            remote=(f"0:127.0.0.1:{port}",),
            socks=("0",),
        ) as pair:
            big = pattern(64 * MIB, seed=99)
            # 64 MiB through one connection; the answer comes only after the half-close.
            assert await exchange(pair.port("L"), "hash", big) == hash_answer(big)
            await _many(pair.port("L"))
            # -R: the far end listens, the near end connects to the target.
            payload = pattern(MIB, seed=7)
            assert await exchange(pair.port("R"), "hash", payload) == hash_answer(payload)
            assert await exchange(pair.port("R"), "echo", payload) == payload
            # -D, by name (the far end resolves it) and by address.
            assert await socks_exchange(pair.port("D"), "localhost", port, "echo", payload) == payload
            code, _r, writer = await socks_connect(pair.port("D"), "127.0.0.1", refused, kind=1)
            writer.close()
            assert code == Reply.CONNECTION_REFUSED
            # A refused target closes the local connection at once, with nothing in it.
            assert await exchange(pair.port("L", 1), "echo", b"lost") == b""
            assert pair.far.stats.refused == 2
            assert pair.near.stats.failed == 0 and pair.far.stats.failed == 0
        # Bare channels: no request, the far end's --to.
        async with ends(protocol, to=f"127.0.0.1:{port}", allow=(), reverse=False, local=("0",)) as bare:
            assert await exchange(bare.port("L"), "hash", payload) == hash_answer(payload)
            assert await exchange(bare.port("L"), "echo", payload) == payload
