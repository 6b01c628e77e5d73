"""The polymux side of the interop scenarios, mirroring ``node/mstream_peer.js``.

Channel behaviours by name prefix (the offering side sends, the responder reacts):
``echo/`` echoes until the peer half-closes; ``name/`` replies with the channel's name;
``halfclose/`` counts bytes until the half-close and replies with the count;
``reject/`` is rejected; ``error/<text>`` is terminated at once with ``<text>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
import subprocess
from pathlib import Path

import polymux


NODE_DIR = Path(__file__).parent / "node"


def install_node_peers(who: str = "interop tests") -> Path:
    """The folder of the Node peers, with its npm packages installed (``npm ci`` when the
    lock file is newer). A missing ``node`` or ``npm``, or a failing ``npm ci``, fails the
    calling test (``who`` says which): never a skip."""
    import pytest

    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail(f"the {who} need Node.js and npm on PATH (they are never skipped)")
    lock = NODE_DIR / "package-lock.json"
    stamp = NODE_DIR / "node_modules" / ".package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime:
        result = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            check=False,
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            pytest.fail(f"npm ci failed in {NODE_DIR}:\n{result.stdout}\n{result.stderr}")
    return NODE_DIR


def pattern(index: int, size: int) -> bytes:
    """The bytes the driver sends on ``echo/<index>`` (same formula as the Node peer)."""
    return bytes((j * 31 + index * 7) & 0xFF for j in range(256)) * (size // 256) + bytes(
        (j * 31 + index * 7) & 0xFF for j in range(size % 256)
    )


async def echo_through(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes, piece: int = 64 * 1024
) -> bytes:
    """Write ``data`` in ``piece``-byte writes (draining after each) and half-close, while
    reading everything the peer sends back until its end; return what came back."""

    async def send() -> None:
        view = memoryview(data)
        for off in range(0, len(data), piece):
            writer.write(view[off : off + piece])
            await writer.drain()
        writer.write_eof()

    sender = asyncio.create_task(send())
    received = await reader.read(-1)
    await sender
    return received


def offer_filter(name: str) -> bool:
    """Reject ``reject/`` offers, accept the rest."""
    return not name.startswith("reject/")


async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Handle one incoming channel by its name."""
    transport = writer.transport
    name = transport.get_extra_info("channel_name")
    try:
        if name.startswith("echo/"):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        elif name.startswith("name/"):
            writer.write(name.encode())
            await writer.drain()
            await reader.read()
        elif name.startswith("halfclose/"):
            total = 0
            while data := await reader.read(65536):
                total += len(data)
            writer.write(str(total).encode())
        elif name.startswith("error/"):
            assert isinstance(transport, polymux.ChannelTransport)
            transport.reset(name[len("error/") :])
            return
        writer.write_eof()
        await writer.drain()
    finally:
        writer.close()
        with contextlib.suppress(polymux.PolymuxError, ConnectionError):
            await writer.wait_closed()


async def start_node(script: Path, *args: str, watchdog: float = 90.0) -> asyncio.subprocess.Process:
    """Start one of the Node peers (``node/<script>``) with a watchdog of ``watchdog`` s."""
    return await asyncio.create_subprocess_exec(
        "node",
        str(script),
        *args,
        "--timeout-ms",
        str(int(watchdog * 1000)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def finish_node(proc: asyncio.subprocess.Process, limit: float = 90.0) -> dict[str, object]:
    """Wait for a Node peer; require exit 0; return its JSON summary (last JSON line)."""
    try:
        out, err = await asyncio.wait_for(proc.communicate(), limit)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    lines = [line for line in out.decode().splitlines() if line.startswith("{")]
    assert proc.returncode == 0, f"node peer failed ({proc.returncode}):\n{err.decode()[-4000:]}"
    result: dict[str, object] = json.loads(lines[-1]) if lines else {}
    return result


_sockets = itertools.count()


def unix_path(folder: Path) -> str:
    """A new unix socket path in ``folder`` (a test's ``tmp_path``: removed by pytest)."""
    return str(folder / f"s{next(_sockets)}")


class PeerProcess:
    """A reference peer process (the Go peers) whose stdout and stderr are read while it
    runs: the Go libraries log synchronously from their receive loops, so a full stderr
    pipe would stall the peer's whole session. Keeps the last ``keep`` bytes of stderr."""

    def __init__(self, proc: asyncio.subprocess.Process, keep: int = 64 * 1024) -> None:
        self.proc = proc
        self._keep = keep
        self.stderr = bytearray()
        self._stdout: asyncio.Queue[bytes] = asyncio.Queue()
        self._readers = [
            asyncio.ensure_future(self._read_stdout()),
            asyncio.ensure_future(self._read_stderr()),
        ]

    async def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            await self._stdout.put(line)
        await self._stdout.put(b"")

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self.stderr += chunk
            if len(self.stderr) > 2 * self._keep:
                del self.stderr[: len(self.stderr) - self._keep]

    def stderr_tail(self, n: int = 4000) -> str:
        """The end of what the peer wrote to stderr."""
        return self.stderr[-n:].decode(errors="replace")

    async def listening(self, limit: float = 30.0) -> str:
        """The address of a ``--listen`` peer (its ``LISTENING <port|path>`` line)."""
        line = (await asyncio.wait_for(self._stdout.get(), limit)).decode().split()
        assert line[:1] == ["LISTENING"], f"peer did not listen: {line}\n{self.stderr_tail()}"
        return line[1]

    async def finish(self, limit: float = 90.0) -> dict[str, object]:
        """Wait for the peer to exit 0; return its JSON summary (the last JSON line)."""
        try:
            await asyncio.wait_for(self.proc.wait(), limit)
        except TimeoutError:
            self.kill()
            await self.proc.wait()
            raise
        await asyncio.gather(*self._readers)
        lines: list[str] = []
        while not self._stdout.empty():
            lines.append(self._stdout.get_nowait().decode())
        summaries = [line for line in lines if line.startswith("{")]
        assert self.proc.returncode == 0, (
            f"peer failed ({self.proc.returncode}):\n{''.join(summaries)[-3000:]}\n{self.stderr_tail()}"
        )
        result: dict[str, object] = json.loads(summaries[-1]) if summaries else {}
        return result

    def kill(self) -> None:
        """Stop the peer if it still runs (tests call this in ``finally``)."""
        if self.proc.returncode is None:
            self.proc.kill()

    async def aclose(self) -> None:
        """Kill the peer if it still runs, and reap it."""
        self.kill()
        await self.proc.wait()
        for reader in self._readers:
            reader.cancel()


async def start_peer(binary: Path, *args: str, watchdog: float = 90.0) -> PeerProcess:
    """Start a built reference peer (a Go peer) with a watchdog of ``watchdog`` s."""
    proc = await asyncio.create_subprocess_exec(
        str(binary),
        *args,
        "--timeout-ms",
        str(int(watchdog * 1000)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return PeerProcess(proc)
