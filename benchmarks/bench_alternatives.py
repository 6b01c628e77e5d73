"""polymux beside the Python alternatives, in the same run: bulk throughput over 1 and 16
channels of one connection.

* **asyncssh** (asyncio): N session channels of one SSH connection (encrypted,
  ``aes256-gcm@openssh.com``, no compression), beside polymux yamux over TLS (the
  ``ssl=`` of :func:`polymux.connect`, a self-signed certificate made by ``openssl``) and
  over plain TCP, and N raw asyncio stream connections (plain TCP).
* **py-libp2p** (the ``libp2p`` package, trio): its yamux and mplex muxers over one TCP
  connection with no security layer (a plain TCP stream handed to the muxer), beside
  polymux's yamux and mplex on the same trio backend (:mod:`polymux.anyio`) and N raw trio
  TCP connections.

Every case moves SIZE bytes in all, SIZE/N per channel, in 64 KiB writes; the receiver
reads and counts until the end of the channel and answers one byte. The clock runs from
the first write to the last answer; connecting and opening channels are not timed. Both
ends run in this process and share one event loop (one CPU), as ``bench_omnistreams.py``
does, so each row pays for both ends. Rows are interleaved (A/B/A/B) and the table shows
the median of ``--repeat`` runs with min..max, and the ratio to the raw baseline of the
same event loop.

The alternatives are not polymux dependencies: run it in a virtual environment of its own,

    python3 -m venv /tmp/alt && /tmp/alt/bin/pip install asyncssh libp2p trio uvloop -e '.[anyio]'
    /tmp/alt/bin/python benchmarks/bench_alternatives.py [--mib 64] [--repeat 3] [--loop uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any


MIB = 1 << 20
WRITE = 64 * 1024
READ = 256 * 1024
CHANNELS = (1, 16)

Case = Callable[[int, int], Awaitable[float]]


# -- asyncio: raw streams, polymux over TCP and TLS, asyncssh -------------------------------


async def _asyncio_count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while await reader.read(READ):
        pass
    writer.write(b"\x01")
    await writer.drain()
    writer.close()


async def _asyncio_send(reader: Any, writer: Any, data: memoryview) -> None:
    for i in range(0, len(data), WRITE):
        writer.write(data[i : i + WRITE])
        await writer.drain()
    writer.write_eof()
    assert await reader.read() == b"\x01"


async def raw_asyncio(n: int, size: int) -> float:
    server = await asyncio.start_server(_asyncio_count, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pairs = [await asyncio.open_connection("127.0.0.1", port) for _ in range(n)]
    data = memoryview(bytes(size // n))
    start = time.perf_counter()
    await asyncio.gather(*(_asyncio_send(r, w, data) for r, w in pairs))
    elapsed = time.perf_counter() - start
    for _r, w in pairs:
        w.close()
    server.close()
    await server.wait_closed()
    return elapsed


def polymux_asyncio(tls: tuple[ssl.SSLContext, ssl.SSLContext] | None) -> Case:
    async def case(n: int, size: int) -> float:
        import polymux

        server_ssl, client_ssl = tls if tls else (None, None)
        server = await polymux.start_server(_asyncio_count, "127.0.0.1", 0, protocol="yamux", ssl=server_ssl)
        async with (
            server,
            await polymux.connect(
                "127.0.0.1", server.port, protocol="yamux", ssl=client_ssl,
                server_hostname="localhost" if client_ssl else None,
            ) as session,
        ):  # fmt: skip
            pairs = [await session.open_channel() for _ in range(n)]
            data = memoryview(bytes(size // n))
            start = time.perf_counter()
            await asyncio.gather(*(_asyncio_send(r, w, data) for r, w in pairs))
            return time.perf_counter() - start

    return case


async def asyncssh_case(n: int, size: int) -> float:
    import asyncssh

    class Server(asyncssh.SSHServer):
        def begin_auth(self, username: str) -> bool:
            return False  # no authentication: this is a benchmark on 127.0.0.1

    async def process(proc: asyncssh.SSHServerProcess[bytes]) -> None:
        while await proc.stdin.read(READ):
            pass
        proc.stdout.write(b"\x01")
        proc.exit(0)

    algs = {"encryption_algs": ["aes256-gcm@openssh.com"], "compression_algs": ["none"]}
    server = await asyncssh.create_server(
        Server, "127.0.0.1", 0, server_host_keys=[_host_key()], process_factory=process,
        encoding=None, **algs,
    )  # fmt: skip
    port = server.sockets[0].getsockname()[1]
    async with asyncssh.connect("127.0.0.1", port, known_hosts=None, username="bench", **algs) as conn:
        pairs = []
        for _ in range(n):
            stdin, stdout, _stderr = await conn.open_session(encoding=None)
            pairs.append((stdout, stdin))
        data = memoryview(bytes(size // n))
        start = time.perf_counter()
        await asyncio.gather(*(_asyncio_send(r, w, data) for r, w in pairs))
        elapsed = time.perf_counter() - start
    server.close()
    await server.wait_closed()
    return elapsed


_KEY: Any = None


def _host_key() -> Any:
    global _KEY
    if _KEY is None:
        import asyncssh

        _KEY = asyncssh.generate_private_key("ssh-ed25519")
    return _KEY


def _tls_contexts(folder: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
         "-days", "1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    return server, client


# -- trio: raw TCP, polymux.anyio, py-libp2p -----------------------------------------------


async def _anyio_count(stream: Any) -> None:
    import anyio

    try:
        while True:
            await stream.receive(READ)
    except anyio.EndOfStream:
        pass
    await stream.send(b"\x01")
    await stream.aclose()


async def _anyio_send(stream: Any, data: memoryview) -> None:
    import anyio

    for i in range(0, len(data), WRITE):
        await stream.send(data[i : i + WRITE])
    await stream.send_eof()
    answer = await stream.receive()
    assert answer == b"\x01", answer
    try:
        await stream.receive()
    except (anyio.EndOfStream, anyio.ClosedResourceError):
        pass


async def _listener() -> tuple[Any, int]:
    import anyio

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    return listener, listener.extra(anyio.abc.SocketAttribute.local_port)


async def raw_trio(n: int, size: int) -> float:
    import anyio

    listener, port = await _listener()
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, _anyio_count)
        streams = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(n)]
        data = memoryview(bytes(size // n))
        start = time.perf_counter()
        async with anyio.create_task_group() as senders:
            for s in streams:
                senders.start_soon(_anyio_send, s, data)
        elapsed = time.perf_counter() - start
        tg.cancel_scope.cancel()
    await listener.aclose()
    return elapsed


def polymux_trio(protocol: str) -> Case:
    async def case(n: int, size: int) -> float:
        import anyio

        import polymux.anyio

        listener, port = await _listener()

        async def serve(stream: Any) -> None:
            async with (
                polymux.anyio.session(stream, protocol=protocol, is_client=False) as s,
                anyio.create_task_group() as channels,
            ):
                for _ in range(n):
                    channels.start_soon(_anyio_count, await s.accept_channel())

        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, serve)
            stream = await anyio.connect_tcp("127.0.0.1", port)
            async with polymux.anyio.session(stream, protocol=protocol) as s:
                channels = [await s.open_channel() for _ in range(n)]
                data = memoryview(bytes(size // n))
                start = time.perf_counter()
                async with anyio.create_task_group() as senders:
                    for c in channels:
                        senders.start_soon(_anyio_send, c, data)
                elapsed = time.perf_counter() - start
            tg.cancel_scope.cancel()
        await listener.aclose()
        return elapsed

    return case


class _Conn:
    """A plain TCP stream where py-libp2p's muxers expect a secured connection; a read and
    a write lock, as py-libp2p's own TCP stream (``libp2p.io.trio.TrioTCPStream``) has."""

    def __init__(self, stream: Any, initiator: bool) -> None:
        import anyio

        self.stream = stream
        self.is_initiator = initiator
        self.read_lock = anyio.Lock()
        self.write_lock = anyio.Lock()

    async def read(self, n: int | None = None) -> bytes:
        import anyio

        async with self.read_lock:
            try:
                return bytes(await self.stream.receive(n or READ))
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return b""

    async def write(self, data: bytes) -> None:
        async with self.write_lock:
            await self.stream.send(data)

    async def close(self) -> None:
        await self.stream.aclose()

    def get_remote_address(self) -> None:
        return None

    def get_transport_addresses(self) -> list[Any]:
        return []

    def get_connection_type(self) -> Any:
        from libp2p.abc import ConnectionType

        return ConnectionType.DIRECT


def libp2p_case(muxer: str) -> Case:
    async def case(n: int, size: int) -> float:
        import anyio
        from libp2p.peer.id import ID
        from libp2p.stream_muxer.exceptions import MuxedStreamEOF
        from libp2p.stream_muxer.mplex.exceptions import MplexStreamEOF
        from libp2p.stream_muxer.mplex.mplex import Mplex
        from libp2p.stream_muxer.yamux.yamux import Yamux

        eof = (MuxedStreamEOF, MplexStreamEOF)

        def make(stream: Any, initiator: bool) -> Any:
            conn = _Conn(stream, initiator)
            if muxer == "yamux":
                return Yamux(conn, ID(b"bench"), is_initiator=initiator)  # type: ignore[arg-type]
            return Mplex(conn, ID(b"bench"))  # type: ignore[arg-type]

        async def count(s: Any) -> None:
            try:
                while await s.read(READ):
                    pass
            except eof:
                pass
            await s.write(b"\x01")
            await s.close()

        async def send(s: Any, data: memoryview) -> None:
            for i in range(0, len(data), WRITE):
                await s.write(bytes(data[i : i + WRITE]))
            await s.close()
            answer = b""
            try:
                while not answer:
                    answer = await s.read(1)
            except eof:
                pass
            assert answer == b"\x01", answer

        listener, port = await _listener()
        ready = anyio.Event()
        server_mux: list[Any] = []

        async def serve(stream: Any) -> None:
            mux = make(stream, False)
            server_mux.append(mux)
            async with anyio.create_task_group() as tg:
                tg.start_soon(mux.start)
                ready.set()
                async with anyio.create_task_group() as channels:
                    for _ in range(n):
                        channels.start_soon(count, await mux.accept_stream())
                tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, serve)
            client = make(await anyio.connect_tcp("127.0.0.1", port), True)
            tg.start_soon(client.start)
            await ready.wait()
            streams = [await client.open_stream() for _ in range(n)]
            data = memoryview(bytes(size // n))
            start = time.perf_counter()
            async with anyio.create_task_group() as senders:
                for s in streams:
                    senders.start_soon(send, s, data)
            elapsed = time.perf_counter() - start
            tg.cancel_scope.cancel()
        await listener.aclose()
        return elapsed

    return case


# -- the run ---------------------------------------------------------------------------------


def measure(
    rows: list[tuple[str, Case]], size: int, repeat: int, run: Callable[[Case, int, int], float]
) -> dict[tuple[str, int], list[float]]:
    times: dict[tuple[str, int], list[float]] = {(name, n): [] for name, _ in rows for n in CHANNELS}
    for i in range(repeat):
        for n in CHANNELS:
            for name, case in rows:
                try:
                    times[name, n].append(run(case, n, size))
                except Exception as exc:  # noqa: BLE001 - a failed row is shown, the others go on
                    print(f"  run {i + 1}: {name}, {n} ch: FAILED: {exc!r}", file=sys.stderr)
                print(f"  run {i + 1}/{repeat}: {name}, {n} ch", file=sys.stderr, flush=True)
    return times


def table(title: str, times: dict[tuple[str, int], list[float]], size: int, baseline: str) -> None:
    print(f"\n{title}\n")
    print("| stack | channels | MiB/s (median) | min..max | ratio to " + baseline + " |")
    print("|---|---|---|---|---|")
    for (name, n), runs in times.items():
        if not runs:
            print(f"| {name} | {n} | failed | | |")
            continue
        rates = sorted(size / MIB / t for t in runs)
        base = [size / MIB / t for t in times[baseline, n]]
        ratio = statistics.median(rates) / statistics.median(base) if base else float("nan")
        print(
            f"| {name} | {n} | {statistics.median(rates):,.0f} | {rates[0]:,.0f}..{rates[-1]:,.0f} "
            f"| {ratio:.2f}x |"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=64, help="MiB per case (default 64)")
    p.add_argument("--repeat", type=int, default=3, help="interleaved runs per case (default 3)")
    p.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop", help="asyncio rows' loop")
    p.add_argument("--only", choices=("asyncssh", "libp2p"), help="one of the two tables")
    args = p.parse_args()
    size = args.mib * MIB // (16 * WRITE) * (16 * WRITE)
    print(
        f"polymux {version('polymux')}, asyncssh {version('asyncssh')}, libp2p {version('libp2p')}, "
        f"trio {version('trio')}, Python {platform.python_version()}, {args.mib} MiB per case, "
        f"median of {args.repeat}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    if args.only != "libp2p":
        factory: Any = None
        if args.loop == "uvloop":
            import uvloop

            factory = uvloop.new_event_loop
        with tempfile.TemporaryDirectory() as tmp:
            tls = _tls_contexts(Path(tmp))

            def run_asyncio(case: Case, n: int, size: int) -> float:
                with asyncio.Runner(loop_factory=factory) as runner:
                    return runner.run(case(n, size))

            rows: list[tuple[str, Case]] = [
                ("raw asyncio streams (TCP)", raw_asyncio),
                ("polymux yamux (TCP)", polymux_asyncio(None)),
                ("polymux yamux (TLS)", polymux_asyncio(tls)),
                ("asyncssh channels (SSH)", asyncssh_case),
            ]
            times = measure(rows, size, args.repeat, run_asyncio)
        table(f"asyncio ({args.loop}): one connection, N channels", times, size, "raw asyncio streams (TCP)")
    if args.only != "asyncssh":
        import anyio

        def run_trio(case: Case, n: int, size: int) -> float:
            return anyio.run(case, n, size, backend="trio")  # type: ignore[no-any-return]

        rows = [
            ("raw trio TCP", raw_trio),
            ("polymux yamux (polymux.anyio)", polymux_trio("yamux")),
            ("py-libp2p yamux", libp2p_case("yamux")),
            ("polymux mplex (polymux.anyio)", polymux_trio("mplex")),
            ("py-libp2p mplex", libp2p_case("mplex")),
        ]
        times = measure(rows, size, args.repeat, run_trio)
        table("trio: one TCP connection, N channels", times, size, "raw trio TCP")
    return 0


if __name__ == "__main__":
    sys.exit(main())
