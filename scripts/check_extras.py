"""Run inside a fresh virtual environment that has polymux with ONE documented extra (see
scripts/check-extras): the commands that extra is documented for must work there, so a
dependency missing from pyproject.toml fails here, not on a user's machine.

    python scripts/check_extras.py EXTRA      # core, apps, websockets, anyio, capture, spark-pcap

Where an extra is missing, what needs it must say so in one line naming the extra (exit
status 1, no traceback): checked in the environments that lack it (core, capture).
Every step is bounded in time; the first failure exits 1 with what was run and its output.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Self


ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def run(*args: str | Path, timeout: float = 120, ok: int = 0) -> str:
    """Run a command; fail with its output unless it exits ``ok``; return its stdout."""
    cmd = [str(a) for a in args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=WORK)
    if proc.returncode != ok:
        sys.exit(f"check-extras: {' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def cli(*args: str | Path, timeout: float = 120) -> str:
    return run(PY, "-m", "polymux", *args, timeout=timeout)


def cli_fails(*args: str | Path, says: str) -> None:
    """``polymux ARGS`` exits 1 with one line on stderr, containing ``says``."""
    cmd = [PY, "-m", "polymux", *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, cwd=WORK)
    lines = proc.stderr.splitlines()
    if proc.returncode != 1 or len(lines) != 1 or says not in lines[0]:
        sys.exit(f"check-extras: {' '.join(cmd)} exited {proc.returncode}, expected 1 and one line with "
                 f"{says!r}\n{proc.stdout}\n{proc.stderr}")  # fmt: skip


def absent(*modules: str) -> None:
    """These modules are not installed here (the extra does not pull them in)."""
    for module in modules:
        if importlib.util.find_spec(module) is not None:
            sys.exit(f"check-extras: {module} is installed, and this extra should not bring it")


def record_session(captures: Path, *, frames: bool = False) -> None:
    """A short yamux session, recorded by a CaptureRecorder into ``captures``."""
    import polymux
    from polymux.tracing import CaptureRecorder

    async def session(recorder: CaptureRecorder) -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(65536):
                writer.write(data)
            writer.close()

        server = await polymux.start_server(echo, "127.0.0.1", 0, protocol="yamux")
        async with (
            server,
            await polymux.connect("127.0.0.1", server.port, protocol="yamux", capture=recorder) as s,
        ):
            for i in range(2):
                reader, writer = await s.open_channel(f"c/{i}")
                writer.write(bytes(300_000))
                writer.write_eof()
                await reader.read()

    with CaptureRecorder(captures, frames=frames) as recorder:
        asyncio.run(asyncio.wait_for(session(recorder), 60))


PCAP_HEADER = bytes.fromhex("d4c3b2a1020004000000000000000000ffff000001000000")  # no packets


class Background:
    """A server process whose first stdout line says where it listens."""

    def __init__(self, *args: str | Path, pattern: str) -> None:
        self.proc = subprocess.Popen(
            [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=WORK
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # bounded: the server prints it at once or exits
        match = re.search(pattern, line)
        if not match:
            self.proc.kill()
            sys.exit(f"check-extras: {' '.join(map(str, args))} printed {line!r}, not {pattern!r}")
        self.address = match.group(1)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def check_core() -> None:
    """The library alone: serve + connect, the demo with plain progress, decode of raw bytes."""
    cli("--help")
    with Background(PY, "-m", "polymux", "serve", "--protocol", "yamux", "--tcp", "127.0.0.1:0",
                    pattern=r" on tcp:(\S+)$") as server:  # fmt: skip
        out = cli("connect", "--protocol", "yamux", "--tcp", server.address, "--size", "256KiB")
        assert "echoed and verified" in out, out
    out = cli("demo", "--files", "3", "--total", "96KiB")  # no terminal: plain lines, no rich
    assert "3/3 identical to the originals" in out, out
    raw = WORK / "c2s.bin"
    raw.write_bytes(bytes.fromhex("000100010000000100000000"))  # a yamux SYN (window update)
    assert "open" in cli("decode", "--protocol", "yamux", raw)
    # Without the extras: one line naming the extra to install, exit 1.
    absent("pyarrow", "dpkt", "websockets", "uvloop", "rich", "anyio")
    parquet = WORK / "x.pmcap.parquet"
    parquet.write_bytes(b"PAR1" + bytes(16) + b"PAR1")
    cli_fails("decode", parquet, says="needs pyarrow, which is not installed: pip install 'polymux[capture]'")
    pcap = WORK / "lo.pcap"
    pcap.write_bytes(PCAP_HEADER)
    cli_fails("decode", pcap, says="needs dpkt, which is not installed: pip install 'polymux[pcap]'")
    cli_fails("bridge", "yamux:tcp:127.0.0.1:0", "omnistreams:ws://127.0.0.1:1/",
              says="needs websockets, which is not installed: pip install 'polymux[websockets]'")  # fmt: skip
    cli_fails("webchat", "--tcp", "127.0.0.1:0", "--web", "127.0.0.1:0", "--files", WORK / "webchat",
              says="polymux webchat needs websockets, which is not installed: pip install 'polymux[websockets]'")  # fmt: skip
    cli_fails("bridge", "yamux:tcp:127.0.0.1:0", "mplex:tcp:127.0.0.1:1", "--capture-listen", WORK / "c",
              says="needs pyarrow, which is not installed: pip install 'polymux[capture]'")  # fmt: skip
    cli_fails("connect", "--protocol", "yamux", "--tcp", "127.0.0.1:1", "--uvloop",
              says="needs uvloop, which is not installed: pip install 'polymux[uvloop]'")  # fmt: skip
    import polymux
    from polymux.tracing import CaptureRecorder

    try:
        CaptureRecorder(WORK / "captures")
    except polymux.MissingExtra as exc:
        assert "pip install 'polymux[capture]'" in str(exc), exc
    else:
        sys.exit("check-extras: CaptureRecorder without pyarrow did not raise MissingExtra")
    try:
        import polymux.anyio
    except polymux.MissingExtra as exc:
        assert "pip install 'polymux[anyio]'" in str(exc), exc
    else:
        sys.exit("check-extras: polymux.anyio without anyio did not raise MissingExtra")


def check_capture() -> None:
    """Recording and decoding polymux captures with pyarrow alone (no Spark, no pandas)."""
    absent("pyspark", "pandas", "dpkt")
    captures = WORK / "captures"
    record_session(captures, frames=True)
    capture = min(captures.glob("*.pmcap.parquet"))
    out = cli("decode", capture)
    assert "== format: recorded in the capture" in out and " data " in out, out
    frames = min(captures.glob("*.pmframes.parquet"))
    assert "recorded as frame records" in cli("decode", frames)
    assert '"frame_type":"open"' in cli("decode", "--json", capture)
    pcap = WORK / "lo.pcap"
    pcap.write_bytes(PCAP_HEADER)
    cli_fails("decode", pcap, says="needs dpkt, which is not installed: pip install 'polymux[pcap]'")


def check_apps() -> None:
    """Progress bars (rich) in the demo, and the applications: polymux send / receive and
    polymux chat (the server and a client)."""
    out = cli("demo", "--files", "3", "--total", "96KiB", "--progress", "rich")
    assert "3/3 identical to the originals" in out, out
    inbox = WORK / "inbox"
    (WORK / "outbox").mkdir()
    (WORK / "outbox" / "a.txt").write_bytes(b"polymux " * 1000)
    with Background(PY, "-m", "polymux", "receive", "--protocol", "mstream-v3",
                    "--tcp", "127.0.0.1:0", "--dest", inbox, pattern=r" on tcp:(\S+),") as receiver:  # fmt: skip
        cli("send", "--protocol", "mstream-v3", "--tcp", receiver.address, WORK / "outbox",
            "--progress", "rich")  # fmt: skip
    assert (inbox / "a.txt").read_bytes() == b"polymux " * 1000
    with Background(PY, "-m", "polymux", "chat", "--server", "--protocol", "yamux", "--tcp", "127.0.0.1:0",
                    pattern=r" on tcp:(\S+)$") as chat:  # fmt: skip
        out = cli("chat", "--protocol", "yamux", "--tcp", chat.address, "--nick", "ada", "--say", "hello")
        assert "[#lobby] ada: hello" in out, out


def check_websockets() -> None:
    """The WebSocket entry points: serve_websocket and connect_websocket."""
    import polymux

    async def main() -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.read())
            writer.close()

        async with await polymux.serve_websocket(echo, "127.0.0.1", 0) as server:
            session = await polymux.connect_websocket(f"ws://127.0.0.1:{server.port}/")
            async with session:
                reader, writer = await session.open_pair("echo")
                writer.write(b"over a websocket")
                writer.write_eof()
                assert await reader.read() == b"over a websocket"

    asyncio.run(asyncio.wait_for(main(), 60))


def check_anyio() -> None:
    """polymux.anyio: a session over an anyio TCP stream, against an asyncio server."""
    import anyio

    import polymux
    import polymux.anyio

    async def main() -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.read())
            writer.close()

        with anyio.fail_after(60):
            async with await polymux.start_server(echo, "127.0.0.1", 0, protocol="yamux") as server:
                stream = await anyio.connect_tcp("127.0.0.1", server.port)
                async with polymux.anyio.session(stream, protocol="yamux") as s:
                    channel = await s.open_channel("x")
                    await channel.send(b"over anyio")
                    await channel.send_eof()
                    assert await channel.receive() == b"over anyio"

    anyio.run(main)


def check_spark_pcap() -> None:
    """polymux analyze on a polymux capture and a pcap of the same bytes (and decode)."""
    from polymux.tracing import read_capture

    captures = WORK / "captures"
    record_session(captures)
    spec = importlib.util.spec_from_file_location("pcaputil", ROOT / "tests/tracing/pcaputil.py")
    assert spec is not None and spec.loader is not None
    pcaputil = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pcaputil)
    chunks = read_capture(min(captures.glob("*.pmcap.parquet"))).chunks
    pcap = WORK / "lo.pcap"
    pcaputil.write(pcap, pcaputil.connection([(t, d, bytes(b)) for t, d, b in chunks], disorder=False))
    assert " yamux " in cli("decode", pcap)
    out = cli("analyze", captures, pcap, "--out", WORK / "report", "--quiet", timeout=300)
    page = (WORK / "report" / "index.html").read_text()
    assert '<img src="throughput.png"' in page and "matplotlib is not installed" not in page, out


CHECKS = {
    "core": check_core,
    "apps": check_apps,
    "websockets": check_websockets,
    "anyio": check_anyio,
    "capture": check_capture,
    "spark-pcap": check_spark_pcap,
}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in CHECKS:
        sys.exit(f"usage: check_extras.py {{{','.join(CHECKS)}}}")
    with tempfile.TemporaryDirectory(prefix="polymux-extras-") as folder:
        WORK = Path(folder)
        os.chdir(WORK)
        CHECKS[sys.argv[1]]()
    print(f"check-extras: {sys.argv[1]}: ok")
