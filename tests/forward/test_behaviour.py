"""What users rely on beyond the bytes: the far end's rules (nothing allowed by default,
--allow, --to beside requests), SOCKS5 replies that say why, limits on both ends refused
politely, the far end's bounds on what a near end may ask (request lines, -R), which
end closes first, and a near end that meets something other than a far end."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable

import pytest

import polymux
from polymux.forward import (
    MARK,
    ForwardError,
    NotAForwarder,
    Reply,
    start_far_end,
    start_near_end,
)
from polymux.forward.far import MAX_REVERSE
from polymux.forward.request import Request, control_line, format_reply

from .helpers import (
    MIB,
    closed_port,
    ends,
    exchange,
    hash_answer,
    pattern,
    refused,
    socks_connect,
    socks_exchange,
    target_server,
)


pytestmark = pytest.mark.timeout(60)


async def test_with_no_allow_and_no_to_every_target_is_refused() -> None:
    async with (
        target_server() as port,
        ends("mstream-v3", allow=(), socks=("0",), local=(f"0:127.0.0.1:{port}",)) as pair,
    ):
        code, _r, writer = await socks_connect(pair.port("D"), "127.0.0.1", port, kind=1)
        writer.close()
        assert code == Reply.NOT_ALLOWED
        assert await refused(pair.port("L"))
        assert pair.far.stats.refused == 2 and pair.far.connections == 0


async def test_allow_rules_decide_and_a_cidr_rule_sees_what_a_name_resolves_to() -> None:
    async with target_server() as port, target_server() as other:
        allow = (f"localhost:{port}", f"127.0.0.0/8:{other}")
        async with ends("yamux", allow=allow, socks=("0",)) as pair:
            d = pair.port("D")
            assert await socks_exchange(d, "localhost", port, "echo", b"by name") == b"by name"
            # A name rule is that name: the address it stands for is another request.
            code, _r, w = await socks_connect(d, "127.0.0.1", port, kind=1)
            w.close()
            assert code == Reply.NOT_ALLOWED
            # A network rule: the name is resolved, and connected to at an allowed address.
            assert await socks_exchange(d, "localhost", other, "echo", b"resolved") == b"resolved"
            assert await socks_exchange(d, "127.0.0.1", other, "echo", b"address") == b"address"


async def test_socks5_replies_say_why() -> None:
    async with target_server() as port:
        six = await asyncio.start_server(_echo, "::1", 0)
        six_port = six.sockets[0].getsockname()[1]
        try:
            async with ends(
                "mplex",
                allow=(f"127.0.0.1:{port}", f"[::1]:{six_port}", "no-such-host.invalid:*"),
                socks=("0",),
                far_options={"connect_timeout": 30.0},
            ) as pair:
                d = pair.port("D")
                # IPv6, by address.
                code, reader, writer = await socks_connect(d, "::1", six_port, kind=4)
                assert code == Reply.SUCCEEDED
                writer.write(b"six")
                writer.write_eof()
                assert await reader.read() == b"six"
                writer.close()
                for command in (2, 3):  # BIND, UDP ASSOCIATE
                    code, _r, w = await socks_connect(d, "127.0.0.1", port, kind=1, command=command)
                    w.close()
                    assert code == Reply.COMMAND_NOT_SUPPORTED
                code, _r, w = await socks_connect(d, "no-such-host.invalid", 80)
                w.close()
                assert code == Reply.HOST_UNREACHABLE
                # An address type SOCKS5 does not have.
                reader, writer = await asyncio.open_connection("127.0.0.1", d)
                writer.write(b"\x05\x01\x00\x05\x01\x00\x09")
                assert await reader.readexactly(2) == b"\x05\x00"
                assert (await reader.readexactly(10))[1] == Reply.ADDRESS_TYPE_NOT_SUPPORTED
                writer.close()
                # A client that offers only authentication: no acceptable method.
                reader, writer = await asyncio.open_connection("127.0.0.1", d)
                writer.write(b"\x05\x01\x02")
                assert await reader.read() == b"\x05\xff"
                writer.close()
        finally:
            six.close()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def test_to_and_requests_side_by_side_on_a_format_with_names() -> None:
    async with (
        target_server() as port,
        ends("mstream-v3", to=f"127.0.0.1:{port}", local=("0", f"0:127.0.0.1:{port}")) as pair,
    ):
        payload = pattern(MIB)
        assert await exchange(pair.port("L", 0), "hash", payload) == hash_answer(payload)
        assert await exchange(pair.port("L", 1), "hash", payload) == hash_answer(payload)


async def test_to_with_requests_on_a_format_without_names_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="carry no names"):
        await start_far_end("yamux:tcp:127.0.0.1:0", to="127.0.0.1:1", allow=["*"])
    with pytest.raises(ValueError, match="carry no names"):
        await start_far_end("smux:tcp:127.0.0.1:0", to="127.0.0.1:1", reverse=True)


async def _hold(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection through ``port`` to the target's ``hold`` (open until closed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"hold\n")
    await writer.drain()
    return reader, writer


async def _until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:  # noqa: ASYNC109
    """Wait until ``predicate()`` holds (polling the loop), or fail after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_max_connections_on_the_near_end_refuses_politely() -> None:
    async with (
        target_server() as port,
        ends("yamux", local=(f"0:127.0.0.1:{port}",), socks=("0",), max_connections=2) as pair,
    ):
        held = [await _hold(pair.port("L")) for _ in range(2)]
        await _until(lambda: pair.far.connections == 2)
        assert await refused(pair.port("L"))  # closed at once
        code, _r, w = await socks_connect(pair.port("D"), "127.0.0.1", port, kind=1)
        w.close()
        assert code == Reply.GENERAL_FAILURE
        for _reader, writer in held:
            writer.close()
        await _until(lambda: pair.near.connections == 0)
        assert await exchange(pair.port("L"), "echo", b"again") == b"again"
        assert pair.near.stats.refused == 2


async def test_max_connections_on_the_far_end_refuses_politely() -> None:
    async with (
        target_server() as port,
        ends(
            "mstream-v2", socks=("0",), local=(f"0:127.0.0.1:{port}",), far_options={"max_connections": 2}
        ) as pair,
    ):
        held = [await _hold(pair.port("L")) for _ in range(2)]
        await _until(lambda: pair.far.connections == 2)
        code, _r, w = await socks_connect(pair.port("D"), "127.0.0.1", port, kind=1)
        w.close()
        assert code == Reply.GENERAL_FAILURE
        assert await refused(pair.port("L"))
        assert pair.far.stats.refused == 2
        for _reader, writer in held:
            writer.close()


async def _raw_session(far_port: int, protocol: str) -> polymux.Session:
    return await polymux.connect("127.0.0.1", far_port, protocol=protocol)


@pytest.mark.parametrize("protocol", ["yamux", "mplex"])
async def test_request_lines_are_bounded_in_size_and_time(protocol: str) -> None:
    far = await start_far_end(f"{protocol}:tcp:127.0.0.1:0", allow=["*"], request_timeout=0.5)
    try:
        session = await _raw_session(far.endpoint.port, protocol)
        async with session:
            for says, answer in [
                (b"PMXF/1 CONNECT " + b"a" * 4000 + b" 1\n", b"ERR 1 "),  # past MAX_LINE
                (b"", b"ERR 6 "),  # nothing within request_timeout
                (b"GET / HTTP/1.1\r\n\r\n", b"ERR 7 "),  # not ours
            ]:
                reader, writer = await session.open_channel(MARK)
                writer.write(says)
                assert (await reader.read()).startswith(answer)
                writer.close()
        assert far.stats.refused == 3
    finally:
        far.close()


LISTENERS = 5


async def test_reverse_is_off_unless_allowed_and_bounded_per_session() -> None:
    assert MAX_REVERSE == 64  # the default: ssh sets none; a near end rarely needs more
    async with target_server() as port:
        far = await start_far_end("mstream-v3:tcp:127.0.0.1:0", reverse=False)
        try:
            with pytest.raises(ForwardError, match="-R is off"):
                await start_near_end(
                    f"mstream-v3:tcp:127.0.0.1:{far.endpoint.port}", remote=[f"0:127.0.0.1:{port}"]
                )
        finally:
            far.close()
        far = await start_far_end("mstream-v3:tcp:127.0.0.1:0", reverse=True, max_reverse=LISTENERS)
        try:
            with pytest.raises(ForwardError, match="only loopback"):
                await start_near_end(
                    f"mstream-v3:tcp:127.0.0.1:{far.endpoint.port}", remote=[f"0.0.0.0:0:127.0.0.1:{port}"]
                )
            # A near end that asks for more listeners than a session may hold.
            session = await _raw_session(far.endpoint.port, "mstream-v3")
            async with session:
                reader, writer = await session.open_channel(MARK)
                writer.write(Request("CONTROL").encode())
                assert await reader.readline() == format_reply(Reply.SUCCEEDED)
                for number in range(LISTENERS + 1):
                    writer.write(control_line("LISTEN", number, "127.0.0.1", 0))
                answers = [await reader.readline() for _ in range(LISTENERS + 1)]
                assert all(a.startswith(b"LISTENING ") for a in answers[:LISTENERS])
                assert answers[-1].startswith(b"REFUSED 5 1 at most 5 -R listeners per session")
                assert len(far._reverse) == LISTENERS
                # One control channel per session: -R listeners are bounded per session.
                second_reader, second_writer = await session.open_channel(MARK)
                second_writer.write(Request("CONTROL").encode())
                assert (await second_reader.read()).startswith(b"ERR 1 one control channel per session")
                second_writer.close()
                writer.write_eof()  # the control channel ends: its listeners go
                await _until(lambda: not far._reverse)
        finally:
            far.close()


async def test_a_target_that_closes_first_ends_the_local_connection_after_its_last_byte() -> None:
    async with target_server() as port, ends("smux-v2", local=(f"0:127.0.0.1:{port}",)) as pair:
        reader, writer = await asyncio.open_connection("127.0.0.1", pair.port("L"))
        writer.write(b"send 3000000\n")  # and the client never half-closes
        got = await reader.read()
        assert got == pattern(256 * 1024) * 11 + pattern(256 * 1024)[: 3000000 - 11 * 256 * 1024]
        writer.close()


async def test_a_reset_target_resets_the_local_connection() -> None:
    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(5)
        # Closed with no lingering: a reset (RST), not an end (FIN).
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
        writer.transport.abort()

    server = await asyncio.start_server(reset, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with ends("mstream-v2", local=(f"0:127.0.0.1:{port}",)) as pair:
            reader, writer = await asyncio.open_connection("127.0.0.1", pair.port("L"))
            writer.write(b"12345")
            with contextlib.suppress(ConnectionResetError):
                assert await reader.read() == b""
            writer.close()
            await _until(lambda: pair.far.stats.failed == 1 and pair.near.stats.failed == 1)
    finally:
        server.close()


async def test_a_near_end_whose_peer_is_not_a_far_end_says_so() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _echo(reader, writer)

    server = await polymux.start_server(echo, "127.0.0.1", 0, protocol="yamux")
    try:
        with pytest.raises(NotAForwarder, match="does not answer forward requests"):
            await start_near_end(f"yamux:tcp:127.0.0.1:{server.port}", local=[f"0:127.0.0.1:{closed_port()}"])
    finally:
        server.close()
