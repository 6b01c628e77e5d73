"""Every example in the README and the documentation runs: each ```python block is run in
a fresh interpreter (in an empty folder, bounded in time) and must exit 0; each ```sh
block's ``polymux`` commands must parse with the real parser (optional ``[...]`` parts and
redirections left out). A block that needs input files says so on the line before it:
``<!-- needs: captures/ -->`` gets a folder of polymux captures of a small session."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from polymux.cli import build_parser


ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "SECURITY.md", *(ROOT / "docs").rglob("*.md")],
    key=lambda p: str(p),
)
PAGES = [p for p in PAGES if "_build" not in p.parts]
BLOCK = re.compile(r"(?P<before>[^\n]*)\n```(?P<lang>[\w-]*)\n(?P<body>.*?)\n```", re.DOTALL)


def _blocks(lang: str) -> list[tuple[str, str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            if m.group("lang") != lang:
                continue
            line = text[: m.start("body")].count("\n") + 1
            needs = re.search(r"<!-- needs: (\S+) -->", m.group("before"))
            found.append(
                (f"{page.relative_to(ROOT)}:{line}", m.group("body"), needs.group(1) if needs else "")
            )
    return found


PYTHON = _blocks("python")
SHELL = _blocks("sh")


def test_the_pages_have_examples() -> None:
    assert len(PYTHON) >= 6 and len(SHELL) >= 8
    assert any(where.startswith("README.md") for where, _code, _needs in PYTHON)


def _record_captures(folder: Path) -> None:
    """A small yamux session (an echo of 64 KiB on 2 channels), recorded into ``folder``."""
    import asyncio

    import polymux
    from polymux.tracing import CaptureRecorder

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
            for i in range(2):
                reader, writer = await session.open_channel(f"c/{i}")
                writer.write(bytes(65536))
                writer.write_eof()
                await reader.read()

    with CaptureRecorder(folder) as recorder:
        asyncio.run(run(recorder))


@pytest.mark.parametrize(("where", "code", "needs"), PYTHON, ids=[b[0] for b in PYTHON])
def test_python_example_runs(where: str, code: str, needs: str, tmp_path: Path) -> None:
    if needs == "captures/":
        _record_captures(tmp_path / "captures")
    else:
        assert not needs, f"{where}: unknown need {needs!r}"
    script = tmp_path / "example.py"
    script.write_text(code)
    timeout = 240 if needs else 60  # the pipeline example starts Spark
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"{where} failed:\n{proc.stdout}\n{proc.stderr}"


def _polymux_commands(code: str) -> list[list[str]]:
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        line = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0])  # comments, optional parts
        line = re.split(r"\s[|>]", line)[0].strip()  # pipes and redirections
        if line.startswith("polymux "):
            commands.append(shlex.split(line)[1:])
    return commands


@pytest.mark.parametrize(("where", "code", "needs"), SHELL, ids=[b[0] for b in SHELL])
def test_shell_example_parses(where: str, code: str, needs: str) -> None:
    parser = build_parser()
    for argv in _polymux_commands(code):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                parser.parse_args(argv)
        except SystemExit as exc:
            if exc.code == 0 and argv in (["--version"], ["-V"], ["--help"]):
                continue  # what argparse does for them: print and exit 0
            raise AssertionError(f"{where}: polymux {' '.join(argv)} does not parse") from exc
