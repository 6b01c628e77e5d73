"""Ctrl-C during ``polymux analyze``, as a terminal sends it (SIGINT to the whole process
group): exit 130 with one line, and nothing else: no py4j tracebacks (about 50 lines of
them before), no Java stacks of the tasks killed, no JVM printing after the command exited.
Interrupted while the JVM starts and while Spark works."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

import polymux
from polymux.tracing import CaptureRecorder


pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def _record(folder: Path) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
        writer.close()

    async def run(recorder: CaptureRecorder) -> None:
        server = await polymux.start_server(echo, "127.0.0.1", 0, protocol="yamux")
        async with (
            server,
            await polymux.connect("127.0.0.1", server.port, protocol="yamux", capture=recorder) as session,
        ):
            for i in range(4):
                reader, writer = await session.open_channel(f"c/{i}")
                writer.write(bytes(200_000))
                writer.write_eof()
                await reader.read()

    with CaptureRecorder(folder) as recorder:
        asyncio.run(run(recorder))


def _children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(name))
    return out


def _wait_for_a_child(pid: int) -> None:
    """Until ``pid`` has started a process (a process table has no event to wait on)."""
    while not _children(pid):
        time.sleep(0.02)


def _still_running(pids: list[int], seconds: float) -> list[int]:
    """Those of ``pids`` still running after up to ``seconds`` (polled)."""
    deadline = time.monotonic() + seconds
    while True:
        alive = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                alive.append(pid)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("when", ["the JVM starts", "Spark works"])
async def test_ctrl_c_prints_one_line(tmp_path: Path, when: str) -> None:
    await asyncio.to_thread(_record, tmp_path / "captures")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polymux", "analyze", str(tmp_path / "captures"), "--out", str(tmp_path / "out"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        start_new_session=True, preexec_fn=_default_signals,
    )  # fmt: skip
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(120):
            if when == "the JVM starts":  # the JVM is its child: it has started, Spark not yet
                await asyncio.to_thread(_wait_for_a_child, proc.pid)
            else:
                while not any(line.startswith("polymux analyze: spark ") for line in lines):
                    line = await proc.stderr.readline()
                    assert line, lines
                    lines.append(line.decode())
        jvm = _children(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        async with asyncio.timeout(60):
            rest, _ = await asyncio.gather(proc.stderr.read(), proc.wait())
        left = await asyncio.to_thread(_still_running, jvm, 30)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    lines += rest.decode().splitlines(keepends=True)
    assert proc.returncode == 130, lines
    text = "".join(lines)
    assert text.rstrip().endswith("polymux analyze: interrupted"), text
    assert "Traceback" not in text and "\tat " not in text and "ERROR" not in text, text
    others = [ln for ln in lines if not ln.startswith(("polymux analyze: ", "WARNING: Using incubator"))]
    assert others == [], text
    assert jvm and not left, f"the JVM outlived the command: {left}"  # no orphan left running
