"""``polymux serve`` and ``polymux connect`` run as subprocesses, as a user runs them:
connect against serve for every wire format polymux speaks (picked up from
``polymux.PROTOCOLS``, so a newly landed format is tested too), TCP and unix sockets,
pattern and file, echo and discard, clean stop on SIGTERM, errors and exit codes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
from pathlib import Path

import pytest

import polymux
from polymux.apps.common import two_way
from polymux.cli import main

from .procs import Proc, Procs


SIZE = 512 * 1024


async def serve(procs: Procs, protocol: str, *extra: str) -> tuple[Proc, str]:
    """Start ``polymux serve``; return it and its address argument."""
    server = await procs.polymux("serve", "--protocol", protocol, *extra, name=f"serve {protocol}")
    m = await server.line(r" on (tcp:(\S+)|unix:(\S+))$")
    if m.group(2):
        return server, m.group(2)
    return server, m.group(3)


@pytest.mark.parametrize("protocol", polymux.PROTOCOLS)
async def test_connect_against_serve_every_format(procs: Procs, protocol: str) -> None:
    server, addr = await serve(procs, protocol, "--tcp", "127.0.0.1:0")
    # The first line is where it listens, for every format (as its --help says).
    assert re.fullmatch(rf"polymux serve: (echo|discard) {protocol} on tcp:{re.escape(addr)}", server.out[0])
    client = await procs.polymux(
        "connect", "--protocol", protocol, "--tcp", addr, "--channels", "4", "--size", str(SIZE), "--json"
    )
    assert await client.wait() == 0, client.describe() + server.describe()
    summary = json.loads(client.out[-1])
    assert summary["protocol"] == protocol and summary["channels"] == 4 and summary["bytes"] == 4 * SIZE
    assert summary["errors"] == [] and summary["seconds"] > 0 and summary["mb_per_s"] > 0
    # One line per channel on the server, with what it read and wrote.
    await server.wait_for(
        lambda: len([ln for ln in server.err if "bytes out" in ln]) == 4,
        "4 channel lines",
    )
    channel_lines = [line for line in server.err if "bytes out" in line]
    assert all(f"{SIZE} bytes in" in line and line.endswith("ok") for line in channel_lines), channel_lines
    if two_way(protocol):
        assert summary["mode"] == "echo" and summary["verified"] is True
        assert summary["echoed"] == 4 * SIZE
        assert all(f"{SIZE} bytes out" in line for line in channel_lines)
    else:
        # One-way channels (omnistreams): no echo is possible. A different, explicit mode:
        # the server says it discards, the client reports it sent without verification,
        # and the server's per-channel lines prove every byte arrived.
        assert summary["mode"] == "one-way" and summary["verified"] is False
        assert summary["echoed"] == 0
        assert any("one-way" in line and "discard mode" in line for line in server.out)
        assert all(" 0 bytes out" in line for line in channel_lines)
    server.send_signal(signal.SIGTERM)
    assert await server.wait() == 0
    assert re.search(r"stopped; 1 sessions, 4 channels \(0 failed\)", server.stdout)


async def test_unix_socket_file_echo_on_uvloop(procs: Procs, short_tmp: Path) -> None:
    sock = short_tmp / "s.sock"
    data = bytes(range(256)) * 3001  # 768,256 bytes, not a multiple of the write size
    (short_tmp / "payload").write_bytes(data)
    server, _ = await serve(procs, "mstream-v2", "--unix", str(sock), "--window", "64K", "--uvloop")
    client = await procs.polymux(
        "connect",
        "--protocol",
        "mstream-v2",
        "--unix",
        str(sock),
        "--uvloop",
        "-n",
        "3",
        "--file",
        str(short_tmp / "payload"),
    )
    assert await client.wait() == 0, client.describe()
    assert "mode echo" in client.out[0]
    assert re.search(
        r"3 channels x 750\.2 KiB = 2\.2 MiB echoed and verified, in [\d.]+ s: [\d.]+ MB/s", client.stdout
    )
    server.send_signal(signal.SIGINT)
    assert await server.wait() == 0
    assert not sock.exists()  # removed on a clean stop


async def test_discard_and_send_only_with_a_pattern(procs: Procs) -> None:
    server, addr = await serve(procs, "yamux", "--tcp", "127.0.0.1:0", "--discard")
    client = await procs.polymux(
        "connect",
        "--protocol",
        "yamux",
        "--tcp",
        addr,
        "-n",
        "2",
        "--size",
        "100K",
        "--pattern",
        "hello ",
        "--send-only",
    )
    assert await client.wait() == 0, client.describe()
    assert "mode send-only" in client.out[0]
    assert "sent (no echo expected)" in client.stdout
    await server.wait_for(
        lambda: sum("102400 bytes in, 0 bytes out" in ln for ln in server.err) == 2, "2 lines"
    )


async def test_echo_mismatch_is_caught(procs: Procs) -> None:
    """A peer that corrupts one byte of the echo makes connect fail (exit 1), naming
    the channel and the offset."""

    async def bad_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen = 0
        while data := await reader.read(65536):
            if seen <= 100_000 < seen + len(data):
                data = bytearray(data)
                data[100_000 - seen] ^= 0xFF
            seen += len(data)
            writer.write(bytes(data))
            await writer.drain()
        writer.close()

    async with await polymux.start_server(bad_echo, "127.0.0.1", 0, protocol="mplex") as server:
        client = await procs.polymux(
            "connect", "--protocol", "mplex", "--tcp", f"127.0.0.1:{server.port}", "-n", "2", "--size", "300K"
        )
        assert await client.wait() == 1, client.describe()
    assert "channel 0: the echo differs at byte 100000" in client.stderr
    assert "channel 1: the echo differs at byte 100000" in client.stderr
    assert "FAILED after" in client.stdout and "2 failed (mplex over tcp:" in client.stdout
    assert "MB/s" not in client.stdout  # no rate for a run that failed


async def test_errors_and_exit_codes(procs: Procs, short_tmp: Path) -> None:
    # Nothing listens there: exit 3 with a clear message.
    client = await procs.polymux(
        "connect", "--protocol", "mstream-v3", "--unix", str(short_tmp / "none.sock")
    )
    assert await client.wait() == 3
    assert "cannot connect to unix:" in client.stderr and "mstream-v3" in client.stderr
    # Bad arguments: exit 2 (argparse), naming the option and the value.
    bad = await procs.polymux("connect", "--protocol", "yamux", "--tcp", "localhost:http")
    assert await bad.wait() == 2
    assert "--tcp: expected HOST:PORT" in bad.stderr
    bad = await procs.polymux("connect", "--protocol", "yamux", "--tcp", "127.0.0.1:1", "--size", "lots")
    assert await bad.wait() == 2 and "argument --size: not a size: 'lots'" in bad.stderr
    bad = await procs.polymux("serve", "--protocol", "nope", "--tcp", "127.0.0.1:0")
    assert await bad.wait() == 2 and "--protocol" in bad.stderr
    # The port is taken: serve cannot listen, exit 1.
    first, addr = await serve(procs, "mplex", "--tcp", "127.0.0.1:0")
    second = await procs.polymux("serve", "--protocol", "mplex", "--tcp", addr)
    assert await second.wait() == 1
    assert f"cannot listen on tcp:{addr}" in second.stderr
    first.send_signal(signal.SIGTERM)
    assert await first.wait() == 0


@pytest.mark.parametrize("command", ["serve", "connect", "demo"])
def test_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: polymux {command}")
    assert "--protocol" in out


async def test_top_level_help_lists_subcommands(procs: Procs) -> None:
    proc = await procs.polymux("--help")
    assert await proc.wait() == 0
    for command in ("demo", "serve", "connect"):
        assert re.search(rf"^\s+{command}\s", proc.stdout, re.MULTILINE), proc.stdout


async def test_server_killed_mid_transfer(procs: Procs) -> None:
    """The peer dies mid-transfer: every channel fails with a clear error, exit 1 (not the
    no-session 3: the peer had spoken mstream-v3), and the summary counts only the bytes
    that really went out. The server dies once it has echoed 1 MiB, not at a moment
    guessed from its log: before its first byte, no session would have existed."""
    echoed = asyncio.Event()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        total = 0
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
            total += len(data)
            if total >= 1 << 20:
                echoed.set()

    server = await polymux.start_server(echo, "127.0.0.1", 0, protocol="mstream-v3")
    try:
        client = await procs.polymux(
            "connect", "--protocol", "mstream-v3", "--tcp", f"127.0.0.1:{server.port}",
            "-n", "2", "--size", "1GiB", "--json",
        )  # fmt: skip
        await asyncio.wait_for(echoed.wait(), 30)
        server.close()  # every session aborted at once, as when the process dies
        assert await client.wait() == 1, client.describe()
    finally:
        server.close()
    summary = json.loads(client.out[-1])
    assert summary["planned_bytes"] == 2 << 30 and summary["bytes"] < summary["planned_bytes"]
    assert summary["verified"] is False and summary["mb_per_s"] is None
    # "connection lost: ... reset by peer", "the session's connection was closed", or
    # "the session is closed" (when it died before the channel was open)
    assert len(summary["errors"]) == 2, summary
    errors = summary["errors"]
    assert all(re.match(r"channel \d: mstream-v3: .*(connection|session is closed)", e) for e in errors), (
        errors
    )


async def test_serve_max_connections(procs: Procs) -> None:
    """``serve --max-connections 1``: a second connection is dropped as it arrives, the
    first is served."""
    _server, addr = await serve(procs, "yamux", "--tcp", "127.0.0.1:0", "--max-connections", "1")
    host, port = addr.rsplit(":", 1)
    async with await polymux.connect(host, int(port), protocol="yamux") as session:
        reader, writer = await session.open_channel("x")
        writer.write(b"first")
        assert await reader.readexactly(5) == b"first"  # served (the echo), so counted
        r2, w2 = await asyncio.open_connection(host, int(port))
        async with asyncio.timeout(10):
            assert await r2.read() == b""  # dropped
        w2.close()
        writer.write_eof()
        assert await reader.read() == b""


@pytest.mark.parametrize("protocol", polymux.PROTOCOLS)
async def test_serve_and_connect_with_no_options(procs: Procs, protocol: str) -> None:
    """The first thing a new user runs: ``polymux serve --protocol P --tcp 127.0.0.1:0`` and
    ``polymux connect --protocol P --tcp ADDR`` with no other option (4 x 16 MiB, echoed
    where channels are two-way; a Streamux server holds each response until its request
    ends: 64 MiB at once, within its default limits)."""
    server, addr = await serve(procs, protocol, "--tcp", "127.0.0.1:0")
    client = await procs.polymux("connect", "--protocol", protocol, "--tcp", addr)
    assert await client.wait(timeout=90) == 0, client.describe() + server.describe()
    assert re.search(r"4 channels x 16\.0 MiB = 64\.0 MiB (echoed and verified|sent one-way)", client.stdout)
    assert not [line for line in server.err if "failed" in line], server.describe()


async def test_a_streamux_response_ended_early_is_explained(procs: Procs) -> None:
    """A Streamux responder cannot fail a request on the wire: when it resets a response
    (here: a held response past the server's streamux_response_hold), connect says that
    the server ended the response early and that its log says why."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, polymux.PolymuxError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.close()

    limits = {"streamux_response_hold": 1 << 20, "streamux_hold_budget": 1 << 20}
    server = await polymux.start_server(echo, "127.0.0.1", 0, protocol="streamux", **limits)
    async with server:
        client = await procs.polymux(
            "connect", "--protocol", "streamux", "--tcp", f"127.0.0.1:{server.port}", "--channels", "1"
        )
        assert await client.wait(timeout=60) == 1, client.describe()
    assert "the echo ended after 0 of 16777216 bytes (streamux has no way to report a failed request" in (
        client.stderr
    ), client.describe()


async def test_serve_timeouts(procs: Procs) -> None:
    """``serve --handshake-timeout``: a connection that sends nothing (mplex has no
    handshake) is closed then; ``--idle-timeout``: a session left without channels is closed
    then. Bad values are usage errors naming the option."""
    _server, addr = await serve(
        procs, "mplex", "--tcp", "127.0.0.1:0", "--handshake-timeout", "0.5", "--idle-timeout", "1"
    )
    host, port = addr.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    silent_reader, silent_writer = await asyncio.open_connection(host, int(port))
    start = loop.time()
    async with asyncio.timeout(10):
        with contextlib.suppress(ConnectionError):
            assert await silent_reader.read() == b""
    assert loop.time() - start < 3
    silent_writer.close()
    async with await polymux.connect(host, int(port), protocol="mplex") as session:
        assert await session.request(b"hi") == b"hi"  # a whole frame: no first-frame deadline
        start = loop.time()
        async with asyncio.timeout(10):
            await session.wait_closed()  # no channels left: idle_timeout
        assert 0.5 < loop.time() - start < 4
    for option, value, message in (
        ("--idle-timeout", "0", "must be positive: '0' (or 'off')"),
        ("--handshake-timeout", "off", "must be a number of seconds: 'off'"),
        ("--keepalive-interval", "soon", "not a number of seconds: 'soon' (or 'off')"),
    ):
        bad = await procs.polymux("serve", "--protocol", "mplex", "--tcp", "127.0.0.1:0", option, value)
        assert await bad.wait() == 2 and f"argument {option}: {message}" in bad.stderr, bad.describe()
    off = await procs.polymux(
        "serve",
        "--protocol",
        "yamux",
        "--tcp",
        "127.0.0.1:0",
        "--idle-timeout",
        "off",
        "--keepalive-interval",
        "off",
    )
    await off.line(r"polymux serve: echo yamux on tcp:")


async def _wrong_client(port: int, kind: str) -> None:
    """A client that never speaks yamux: another format, HTTP, TLS, or nothing at all."""
    raw = {
        "http": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "tls": bytes.fromhex("16030100f8010000f40303") + bytes(64),
        "silent": b"",
    }
    if kind in raw:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(raw[kind])
        await writer.drain()
        writer.close()
        return
    try:
        session = await asyncio.wait_for(polymux.connect("127.0.0.1", port, protocol=kind), 5)
        async with session:
            reader, writer = await session.open_pair("x")
            writer.write(b"hello")
            writer.write_eof()
            await asyncio.wait_for(reader.read(), 5)
    except (TimeoutError, ConnectionError, polymux.PolymuxError):
        pass


WRONG = ["mplex", "mstream-v2", "mstream-v3", "streamux", "omnistreams", "smux", "http", "tls", "silent"]


async def test_serve_logs_every_wrong_format_connection(procs: Procs) -> None:
    """One line per connection whose client never spoke the format, saying what it sent
    (3 of 6 wrong-format handshakes were not logged at all)."""
    server, addr = await serve(procs, "yamux", "--tcp", "127.0.0.1:0", "--handshake-timeout", "2")
    port = int(addr.rsplit(":", 1)[1])
    for kind in WRONG:  # one at a time: each line can be matched to its client
        before = len(server.err)
        await _wrong_client(port, kind)
        await server.wait_for(
            lambda before=before: any("no yamux session: " in ln for ln in server.err[before:]),
            f"a line for the {kind} client",
        )
        line = next(ln for ln in server.err[before:] if "no yamux session: " in ln)
        assert re.search(r"connection from 127\.0\.0\.1:\d+: no yamux session: ", line), line
        if kind == "http":
            assert "the peer speaks HTTP, not yamux (certain: it sent an HTTP request (GET /)" in line, line
        elif kind == "tls":
            assert "the peer speaks TLS, not yamux (certain: it sent a TLS ClientHello record" in line, line
        elif kind == "silent":
            assert "the client closed the connection without sending a byte" in line, line
    server.send_signal(signal.SIGTERM)
    assert await server.wait() == 0
    assert f"{len(WRONG)} connections without one" in server.stdout, server.stdout
