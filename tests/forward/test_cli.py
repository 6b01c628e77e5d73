"""``polymux forward`` as users run it: both ends as processes over every transport (TCP,
a unix socket, TLS, WebSocket, WebSocket over TLS), the lines scripts wait for, curl
through -D, Ctrl-C/SIGTERM with a grace period, --stats and --quiet, and the exit
statuses of the CLI's table."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cli.procs import Proc, Procs
from polymux.cli import main

from .helpers import MIB, closed_port, exchange, hash_answer, pattern, target_server


pytestmark = pytest.mark.timeout(90)

BODY = b"hello through polymux forward\n"


async def _http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A one-page HTTP/1.0 server."""
    try:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
        )
        await writer.drain()
    finally:
        writer.close()


async def _curl(*args: str) -> tuple[int, bytes]:
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("the -D tests run curl (apt-get install curl; they are never skipped)")
    proc = await asyncio.create_subprocess_exec(
        curl, "-s", "--max-time", "30", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, _err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out


def _where(transport: str, tmp: Path, cert: tuple[Path, Path]) -> tuple[list[str], list[str]]:
    """The far end's --listen arguments and the near end's extra --connect arguments."""
    tls = ["--tls-cert", str(cert[0]), "--tls-key", str(cert[1])]
    ca = ["--tls-ca", str(cert[0])]
    return {
        "tcp": (["--listen", "127.0.0.1:0"], []),
        "unix": (["--listen", f"unix:{tmp}/far.sock"], []),
        "tls": (["--listen", "127.0.0.1:0", *tls], ca),
        "ws": (["--listen", "ws://127.0.0.1:0/forward"], []),
        "wss-uvloop": (["--listen", "ws://127.0.0.1:0/forward", *tls, "--uvloop"], [*ca, "--uvloop"]),
    }[transport]


async def _stop(proc: Proc) -> str:
    """SIGTERM; the process must exit 0 with its summary line. Returns its stdout."""
    proc.send_signal(signal.SIGTERM)
    assert await proc.wait() == 0, proc.describe()
    assert "polymux forward: stopped; " in proc.stdout, proc.describe()
    return proc.stdout


@pytest.mark.parametrize(
    ("transport", "protocol"),
    [
        ("unix", "mplex"),
        ("tls", "mstream-v3"),
        ("ws", "omnistreams"),
        ("wss-uvloop", "smux-v2"),
        ("tcp", "streamux"),
    ],
)
async def test_both_ends_over_every_transport(
    procs: Procs, short_tmp: Path, cert: tuple[Path, Path], transport: str, protocol: str
) -> None:
    http = await asyncio.start_server(_http, "127.0.0.1", 0)
    http_port = http.sockets[0].getsockname()[1]
    listen, connect_extra = _where(transport, short_tmp, cert)
    try:
        async with target_server() as port:
            far = await procs.polymux(
                "forward", *listen, "--protocol", protocol, "--allow", "127.0.0.1:*", "--allow", "localhost:*"
            )
            where = (await far.line(r"^listening (\S+)$")).group(1)
            if transport.startswith("wss"):
                assert where.startswith("wss://127.0.0.1:")
            near = await procs.polymux(
                "forward", "--connect", where, *connect_extra, "--protocol", protocol,
                "-L", f"0:127.0.0.1:{port}", "-D", "127.0.0.1:0",
            )  # fmt: skip
            local = int(
                (await near.line(rf"^listening -L 127\.0\.0\.1:(\d+) -> 127\.0\.0\.1:{port}$")).group(1)
            )
            socks = int((await near.line(r"^listening -D 127\.0\.0\.1:(\d+) \(SOCKS5\)$")).group(1))
            # A client that half-closes (nc -N) gets the whole answer.
            payload = pattern(MIB, seed=5)
            assert await exchange(local, "hash", payload) == hash_answer(payload)
            code, page = await _curl(
                "--socks5-hostname", f"127.0.0.1:{socks}", f"http://localhost:{http_port}/"
            )
            assert (code, page) == (0, BODY)
            await _stop(near)
            await _stop(far)
            assert f"-> localhost:{http_port}" in near.stderr and ", ok" in near.stderr
    finally:
        http.close()


@pytest.fixture
async def pair(procs: Procs) -> AsyncIterator[tuple[Proc, Proc, int, int]]:
    """A far end (allowing 127.0.0.1) and a near end with -L to a target: (far, near, the
    -L port, the target port)."""
    async with target_server() as port:
        far = await procs.polymux("forward", "--listen", "127.0.0.1:0", "--allow", "127.0.0.1:*", "--quiet")
        where = (await far.line(r"^listening (\S+)$")).group(1)
        near = await procs.polymux(
            "forward", "--connect", where, "-L", f"0:127.0.0.1:{port}", "--stats", "0.2", "--grace", "30"
        )
        local = int((await near.line(r"^listening -L 127\.0\.0\.1:(\d+)")).group(1))
        yield far, near, local, port


async def test_sigterm_lets_open_connections_finish_and_stats_and_quiet(
    pair: tuple[Proc, Proc, int, int],
) -> None:
    far, near, local, _port = pair
    assert await exchange(local, "echo", b"one") == b"one"
    await near.line(r"^polymux forward: 0 open, 1 done .*MB/s$")  # --stats
    reader, writer = await asyncio.open_connection("127.0.0.1", local)
    writer.write(b"echo\nbefore the signal, ")
    assert await reader.readexactly(len("before the signal, ")) == b"before the signal, "
    near.send_signal(signal.SIGTERM)
    await near.line(r"polymux\.forward stopping", stream="err")
    with contextlib.suppress(OSError):  # refused (or, the port taken since, nothing of the near end's)
        _late_reader, late = await asyncio.open_connection("127.0.0.1", local)
        late.close()
    writer.write(b"after it")
    writer.write_eof()
    assert await reader.read() == b"after it"
    writer.close()
    assert await near.wait() == 0
    # Two connections in all: it accepted none after the signal, the late one included.
    assert "polymux forward: stopped; 2 connections (0 refused, 0 failed)" in near.stdout, near.describe()
    await _stop(far)
    assert ", ok" in near.stderr and ", ok" not in far.stderr  # the far end is --quiet


async def test_after_the_grace_period_open_connections_are_cut(procs: Procs) -> None:
    async with target_server() as port:
        far = await procs.polymux(
            "forward", "--listen", "127.0.0.1:0", "--allow", "127.0.0.1:*", "--grace", "0.2"
        )
        where = (await far.line(r"^listening (\S+)$")).group(1)
        near = await procs.polymux(
            "forward", "--connect", where, "-L", f"0:127.0.0.1:{port}", "--grace", "0.2"
        )
        local = int((await near.line(r"^listening -L 127\.0\.0\.1:(\d+)")).group(1))
        reader, writer = await asyncio.open_connection("127.0.0.1", local)
        writer.write(b"hold\n")
        await far.line(r"session from", stream="err")
        near.send_signal(signal.SIGINT)  # Ctrl-C
        assert await near.wait() == 0
        try:
            assert await reader.read() == b""
        except ConnectionResetError:
            pass
        writer.close()
        await _stop(far)


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, says in [
        (["--listen", "127.0.0.1:0", "-L", "1"], "options of the near end"),
        (["--connect", "127.0.0.1:1", "--allow", "*"], "options of the far end"),
        (["--connect", "127.0.0.1:1"], "give at least one -L, -R or -D"),
        (["--connect", "127.0.0.1:1", "-L", "8080:80"], "not a bind address"),
        (["--connect", "127.0.0.1:0", "-D", "1"], "a port is needed"),
        (["--listen", "127.0.0.1:0", "--to", "127.0.0.1:1", "--allow", "*"], "carry no names"),
        (["--listen", "127.0.0.1:0", "--allow", "10.0.0.1/8:22"], "not a CIDR network"),
        (["--listen", "127.0.0.1:0", "--tls-cert", "c.pem"], "go together"),
        (["--listen", "nowhere"], "expected HOST:PORT"),
    ]:
        with pytest.raises(SystemExit) as caught:
            main(["forward", *argv])
        assert caught.value.code == 2, argv
        assert says in capsys.readouterr().err, argv


def test_a_far_end_that_cannot_listen_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["forward", "--listen", f"127.0.0.1:{taken.getsockname()[1]}"]) == 1
    assert "cannot listen" in capsys.readouterr().err


def test_a_near_end_without_a_far_end_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["forward", "--connect", f"127.0.0.1:{closed_port()}", "-L", "0:127.0.0.1:1"]) == 3
    assert "cannot connect" in capsys.readouterr().err


async def test_a_near_end_whose_peer_is_no_far_end_exits_3_and_a_refused_r_exits_1(procs: Procs) -> None:
    serve = await procs.polymux("serve", "--protocol", "yamux", "--tcp", "127.0.0.1:0")
    port = (await serve.line(r"on tcp:127\.0\.0\.1:(\d+)")).group(1)
    near = await procs.polymux("forward", "--connect", f"127.0.0.1:{port}", "-D", "0")
    assert await near.wait() == 3
    assert "does not answer forward requests" in near.stderr
    # A far end of another format: the diagnosis names it.
    near = await procs.polymux(
        "forward", "--connect", f"127.0.0.1:{port}", "--protocol", "mstream-v3", "-D", "0"
    )
    assert await near.wait() == 3
    assert "yamux" in near.stderr, near.describe()
    far = await procs.polymux("forward", "--listen", "127.0.0.1:0")
    where = (await far.line(r"^listening (\S+)$")).group(1)
    await far.line("every target is refused", stream="err")  # said at start: no open proxy by default
    near = await procs.polymux("forward", "--connect", where, "-R", "0:127.0.0.1:1")
    assert await near.wait() == 1
    assert "-R is off on the far end" in near.stderr


@pytest.mark.parametrize("protocol", ["yamux", "omnistreams"])
async def test_the_example_fetches_a_page_three_ways(procs: Procs, protocol: str) -> None:
    example = await procs.example("forward.py", "--protocol", protocol)
    assert await example.wait() == 0, example.describe()
    for kind in ("-L", "-D", "-R"):
        assert f"{kind}: hello through polymux forward" in example.out, example.describe()
