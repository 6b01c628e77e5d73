"""A CaptureRecorder nobody closes is closed at interpreter exit, and its capture is
complete and readable: the promise of its docstring, checked in a real interpreter exit
(a subprocess), with and without the session closed, with and without frame records."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from polymux.tracing import read_capture


SCRIPT = """
import asyncio, sys
import polymux
from polymux.tracing import CaptureRecorder

recorder = CaptureRecorder(sys.argv[1], frames=sys.argv[3] == "frames")  # never closed

async def echo(reader, writer):
    writer.write(await reader.read())
    writer.close()

async def main():
    server = await polymux.start_server(echo, "127.0.0.1", 0, protocol="yamux")
    async with server:
        session = await polymux.connect("127.0.0.1", server.port, protocol="yamux", capture=recorder)
        reader, writer = await session.open_channel("x")
        writer.write(b"hello from a forgotten recorder")
        writer.write_eof()
        print(await reader.read())
        if sys.argv[2] == "aclose":
            await session.aclose()

asyncio.run(main())
"""


@pytest.mark.parametrize(("session_end", "frames"), [("aclose", "frames"), ("left-open", "no-frames")])
def test_a_recorder_left_open_writes_a_readable_capture(
    tmp_path: Path, session_end: str, frames: str
) -> None:
    script = tmp_path / "forget.py"
    script.write_text(SCRIPT)
    captures = tmp_path / "captures"
    proc = subprocess.run(
        [sys.executable, str(script), str(captures), session_end, frames],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "can't register atexit" not in proc.stderr, proc.stderr
    files = sorted(captures.glob("*.pmcap.parquet"))
    assert len(files) == 1, list(captures.iterdir())
    capture = read_capture(files[0])
    sent = b"".join(bytes(data) for _t, direction, data in capture.chunks if direction == "c2s")
    assert b"hello from a forgotten recorder" in sent
    assert (frames == "frames") == bool(list(captures.glob("*.pmframes.parquet")))
