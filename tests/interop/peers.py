"""The polymux side of the interop scenarios, mirroring ``node/mstream_peer.js``.

Channel behaviours by name prefix (the offering side sends, the responder reacts):
``echo/`` echoes until the peer half-closes; ``name/`` replies with the channel's name;
``halfclose/`` counts bytes until the half-close and replies with the count;
``reject/`` is rejected; ``error/<text>`` is terminated at once with ``<text>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
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


def unix_path() -> str:
    """A fresh unix socket path (short, in a new temporary folder)."""
    return os.path.join(tempfile.mkdtemp(prefix="pmx"), "s")
