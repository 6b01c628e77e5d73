"""Fixtures of the browser tests: a headless Chromium (Debian's ``chromium``, driven over the
DevTools protocol), the example chat server with its web page, and the folder the tests
save screenshots in (``artifacts``: ``tmp/artifacts/webchat/`` in the repository, or
``$POLYMUX_ARTIFACTS/webchat/``; emptied at the start of each run, named at the end of
pytest's output).

A missing browser FAILS these tests with a message saying how to install it (they are
never skipped): the page is part of what polymux ships.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cli.procs import ROOT, Proc, Procs, procs

from .cdp import BrowserMissing, Chromium, Page, find_chromium


__all__ = ["Browser", "WebChatServer", "artifacts", "browser", "procs", "webchat"]

ARTIFACTS = Path(os.environ.get("POLYMUX_ARTIFACTS") or ROOT / "tmp" / "artifacts") / "webchat"
"""Where the browser tests save their screenshots, for a person to look at."""

_saved: list[Path] = []


@pytest.fixture(scope="session")
def artifacts() -> Iterator[Path]:
    """The screenshot folder (emptied once per run); files saved there are listed at the end."""
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    yield ARTIFACTS
    _saved.extend(sorted(ARTIFACTS.glob("*.png")))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name the screenshot folder at the end of the run."""
    if _saved:
        terminalreporter.write_sep("-", "web chat screenshots")
        terminalreporter.write_line(f"{len(_saved)} screenshots in {ARTIFACTS}:")
        for path in _saved:
            terminalreporter.write_line(f"  {path.name}")


@dataclass
class Browser:
    """A browser with one open tab."""

    chromium: Chromium
    page: Page
    downloads: Path


async def launch_browser(tmp_path: Path, *flags: str) -> Chromium:
    """Headless Chromium with a fresh profile under ``tmp_path`` and more ``flags``; fails the
    test (never skips it) when no Chromium is installed."""
    missing: BrowserMissing | None = None
    try:
        executable = find_chromium()
    except BrowserMissing as exc:
        missing = exc
    if missing is not None:
        pytest.fail(str(missing))
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    return await Chromium.launch(executable, profile, flags=flags)


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    """Headless Chromium with a fresh profile under ``tmp_path``, one tab, downloads saved in
    ``tmp_path / "downloads"``. Fails (never skips) when no Chromium is installed."""
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    chromium = await launch_browser(tmp_path)
    try:
        page = await chromium.new_page()
        await chromium.allow_downloads(downloads)
        yield Browser(chromium, page, downloads)
    finally:
        await chromium.close()


@dataclass
class WebChatServer:
    """The example chat server, started as a user starts it."""

    proc: Proc
    url: str
    """The page, ``http://127.0.0.1:PORT/``."""
    tcp_port: int
    """Where terminal clients connect (mstream-v3)."""
    files: Path
    """Uploads land here, downloads come from here."""
    procs: Procs = field(repr=False)
    web_port: int = 0

    async def stop(self) -> None:
        """Stop the server as Ctrl-C does (SIGTERM) and wait for it to exit."""
        await self.proc.stop()

    async def start_again(self) -> None:
        """Start the server again on the same ports with the same files (a restart)."""
        self.proc = await _start(
            self.procs, self.files, f"127.0.0.1:{self.tcp_port}", f"127.0.0.1:{self.web_port}"
        )
        await self.proc.line(r"web page on (http://\S+/) ")

    async def stats(self) -> dict[str, Any]:
        """The server's ``/stats.json`` (rooms, downloads in progress, resident memory)."""

        def get() -> dict[str, Any]:
            with urllib.request.urlopen(self.url + "stats.json", timeout=10) as answer:
                data: dict[str, Any] = json.load(answer)
                return data

        return await asyncio.to_thread(get)


@pytest.fixture
async def webchat(procs: Procs, tmp_path: Path) -> WebChatServer:
    """``examples/chat/server.py`` on TCP (mstream-v3, for terminal clients) and with its
    web page, on free ports of 127.0.0.1."""
    files = tmp_path / "files"
    files.mkdir()
    server = await _start(procs, files, "127.0.0.1:0", "127.0.0.1:0")
    tcp = await server.line(r" on tcp:127\.0\.0\.1:(\d+)$")
    web = await server.line(r"web page on (http://\S+:(\d+)/) ")
    return WebChatServer(server, web.group(1), int(tcp.group(1)), files, procs, int(web.group(2)))


async def _start(procs: Procs, files: Path, tcp: str, web: str) -> Proc:
    return await procs.example(
        "chat/server.py",
        *("--protocol", "mstream-v3", "--tcp", tcp, "--web", web, "--files", str(files)),
        name="chat server",
    )
