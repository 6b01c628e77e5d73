"""Fixtures of the browser tests: a headless Chromium (Debian's ``chromium``, driven over the
DevTools protocol) and the example chat server with its web page.

A missing browser FAILS these tests with a message saying how to install it (they are
never skipped): the page is part of what polymux ships.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli.procs import Proc, Procs, procs

from .cdp import BrowserMissing, Chromium, Page, find_chromium


__all__ = ["Browser", "WebChatServer", "browser", "procs", "webchat"]


@dataclass
class Browser:
    """A browser with one open tab."""

    chromium: Chromium
    page: Page
    downloads: Path


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    """Headless Chromium with a fresh profile under ``tmp_path``, one tab, downloads saved in
    ``tmp_path / "downloads"``. Fails (never skips) when no Chromium is installed."""
    missing: BrowserMissing | None = None
    try:
        executable = find_chromium()
    except BrowserMissing as exc:
        missing = exc
    if missing is not None:
        pytest.fail(str(missing))
    profile = tmp_path / "profile"
    profile.mkdir()
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    chromium = await Chromium.launch(executable, profile)
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
    server = await procs.example(
        "chat/server.py",
        "--protocol",
        "mstream-v3",
        "--tcp",
        "127.0.0.1:0",
        "--web",
        "127.0.0.1:0",
        "--files",
        str(files),
        name="chat server",
    )
    tcp = await server.line(r" on tcp:127\.0\.0\.1:(\d+)$")
    web = await server.line(r"web page on (http://\S+/) ")
    return WebChatServer(server, web.group(1), int(tcp.group(1)), files)
