"""The web chat in a real browser: headless Chromium opens the page of
``examples/chat/server.py --web``, which runs polymux's ``omnistreams.js`` over WebSocket.

* the page and a terminal client (mstream-v3 over TCP, ``polymux.apps.chat.ChatClient``)
  chat both ways, in two rooms, through the same server;
* a multi-megabyte file goes up (file input) and comes back down (the download link, saved
  by the browser); SHA-256 compared on disk at both ends; throughput measured in the page;
* several transfers at once (one dropped on the page), and chat still flows both ways while a
  download is held;
* a page that stops reading a download stops the server: once everything in flight has
  arrived, the server has read at most one window and its write buffer ahead of the page.

Every wait is for a condition (a DOM change, an output line, a record), bounded in time.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import polymux
from cli.procs import Procs
from polymux.apps.chat import ChatClient
from polymux.apps.filetransfer import CHUNK

from .cdp import BrowserMissing, Page, find_chromium
from .conftest import Browser, WebChatServer


pytestmark = [pytest.mark.browser, pytest.mark.timeout(150)]

WINDOW = 1 << 20
"""What omnistreams.js lets an incoming stream send ahead of the page's reading (its default)."""
WRITE_BUFFER_HIGH = polymux.SessionConfig().write_buffer_high


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def random_file(path: Path, size: int) -> str:
    data = os.urandom(size)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def js(value: object) -> str:
    return json.dumps(value)


async def open_page(page: Page, url: str) -> None:
    await page.goto(url)
    await page.wait_for("document.querySelector('#status').dataset.state === 'ok'")


async def say_in_page(page: Page, text: str) -> None:
    await page.evaluate(
        f"document.querySelector('#text').value = {js(text)}; document.querySelector('#say').requestSubmit()"
    )


async def message_in_page(page: Page, room: str, nick: str, text: str) -> dict[str, Any]:
    """Wait until the page shows ``nick: text`` in ``room``, relayed by the server (ours: no
    longer marked as sending); its data attributes."""
    found: dict[str, Any] = await page.wait_for(
        f"""[...document.querySelectorAll('ol[data-room={js(room)}] li.msg[data-nick={js(nick)}][data-seq]')]
            .filter(li => li.querySelector('.text').textContent === {js(text)})
            .map(li => ({{...li.dataset}}))[0]"""
    )
    return found


async def message_at_terminal(client: ChatClient, room: str, nick: str, text: str) -> dict[str, Any]:
    while True:
        record = await client.read(room)
        assert record is not None, f"the server closed #{room}"
        if record["type"] == "msg" and record["nick"] == nick and record["text"] == text:
            return record


async def transfer_done(page: Page, kind: str, name: str) -> dict[str, str]:
    """Wait until the page's transfer row ends; fail with its error if it failed."""
    row: dict[str, str] = await page.wait_for(
        f"""[...document.querySelectorAll('.transfer[data-kind={js(kind)}][data-name={js(name)}]')]
            .map(li => ({{...li.dataset}})).find(d => ['done', 'failed', 'cancelled'].includes(d.state))"""
    )
    assert row["state"] == "done", f"{kind} of {name} failed in the page: {row.get('error')}"
    return row


async def poll(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 30) -> Any:  # noqa: ASYNC109
    """Re-check ``check()`` until it returns a truthy value, and return that. For a condition
    that spans two other processes (the server and the browser) and that no event marks: each
    check is a round trip to both; the pause only paces the checks, nothing relies on it."""
    try:
        async with asyncio.timeout(timeout):
            while not (value := await check()):  # noqa: ASYNC110 - see the docstring
                await asyncio.sleep(0.02)
            return value
    except TimeoutError:
        raise AssertionError(f"no {what} within {timeout} s") from None


async def join_another(page: Page, room: str) -> None:
    """Join ``room`` as a person does once in a room: "+", the room's name, Join."""
    await page.evaluate("document.querySelector('#add-room').click()")
    await page.wait_for("document.querySelector('#room-dialog').open")
    await page.evaluate(
        f"document.querySelector('#new-room').value = {js(room)}; document.querySelector('#join-room').requestSubmit()"
    )


async def terminal(webchat: WebChatServer, nick: str) -> tuple[polymux.Session, ChatClient]:
    session = await polymux.connect("127.0.0.1", webchat.tcp_port, protocol="mstream-v3")
    return session, ChatClient(session, nick)


def test_missing_browser_fails_with_install_hint(tmp_path: Path) -> None:
    with pytest.raises(BrowserMissing, match=r"scripts/setup --with-system.*apt-get install chromium"):
        find_chromium({"PATH": str(tmp_path)})
    with pytest.raises(BrowserMissing, match="POLYMUX_CHROMIUM='/nonexistent' is not an executable"):
        find_chromium({"PATH": "", "POLYMUX_CHROMIUM": "/nonexistent"})


async def test_page_and_terminal_chat_both_ways(
    browser: Browser, webchat: WebChatServer, procs: Procs
) -> None:
    page = browser.page
    async with asyncio.timeout(60):
        await open_page(page, webchat.url + "?nick=web&room=lobby")
        await page.wait_for("document.querySelector('ol[data-room=lobby] li.joined')")
        session, term = await terminal(webchat, "term")
        async with session:
            welcome = await term.join("lobby")
            assert welcome["members"] == ["term", "web"]
            await page.wait_for(
                "[...document.querySelectorAll('ol[data-room=lobby] li.notice')]"
                ".some(li => li.querySelector('.text').textContent === 'term joined')"
            )
            text = "hello from the browser: héllo ✓ 🚀"
            await say_in_page(page, text)
            record = await message_at_terminal(term, "lobby", "web", text)
            assert record["room"] == "lobby"
            own = await message_in_page(page, "lobby", "web", text)
            assert float(own["rttMs"]) > 0  # the page measured its message's round trip

            await term.say("lobby", "hello from the terminal ✓")
            await message_in_page(page, "lobby", "term", "hello from the terminal ✓")

            # A second room, joined with "+": messages stay in their room.
            await join_another(page, "dev")
            await page.wait_for("document.querySelector('ol[data-room=dev] li.joined')")
            await term.join("dev")
            await say_in_page(page, "in dev only")
            await message_at_terminal(term, "dev", "web", "in dev only")
            await term.say("dev", "dev answer")
            await message_in_page(page, "dev", "term", "dev answer")
            in_lobby = await page.evaluate("document.querySelector('ol[data-room=lobby]').textContent")
            assert "dev answer" not in in_lobby and "in dev only" not in in_lobby

            # The page's nick taken in a room (by a terminal also called web): the server
            # refuses, the page says why and opens no tab.
            await term.join("ops")
            namesake = ChatClient(session, "web")  # kept: a channel whose writer is collected closes
            await namesake.join("ops")
            await join_another(page, "ops")
            refusal = await page.wait_for("document.querySelector('#notice [data-topic=join]').textContent")
            assert refusal == "cannot join #ops: nick 'web' is taken in room 'ops'"
            assert await page.evaluate("document.querySelector('ol[data-room=ops]')") is None

            # The page leaves the room: the terminal is told.
            await page.evaluate("document.querySelector('#rooms .tab[data-room=dev] .leave').click()")
            while (record := await term.read("dev")) is not None and record["type"] != "left":
                pass
            assert record is not None and record["nick"] == "web" and record["reason"] == "left"
            stats = await webchat.stats()
            assert stats["rooms"] == {"lobby": ["term", "web"], "dev": ["term"], "ops": ["term", "web"]}

        # The terminal client of the README (examples/chat/client.py) meets the page too.
        client = await procs.example(
            "chat/client.py",
            *("--protocol", "mstream-v3", "--tcp", f"127.0.0.1:{webchat.tcp_port}"),
            *("--nick", "ada", "--room", "lobby", "--say", "hi from client.py", "--until", "bye ada"),
            name="client.py",
        )
        await message_in_page(page, "lobby", "ada", "hi from client.py")
        await say_in_page(page, "bye ada")
        assert await client.wait() == 0, client.describe()
        assert "[#lobby] web: bye ada" in client.out, client.describe()
        # A plain leave reads as one (not "ada left (left)"), and the member list follows.
        await page.wait_for(
            "[...document.querySelectorAll('ol[data-room=lobby] li.notice .text')].some(t => t.textContent === 'ada left')"
        )
        members = await page.evaluate(
            "[...document.querySelectorAll('#members li')].map(li => li.dataset.nick)"
        )
        assert members == ["web"]  # term left with its session, ada with client.py
    assert page.errors == []


async def test_upload_and_download_verified(browser: Browser, webchat: WebChatServer, tmp_path: Path) -> None:
    page = browser.page
    size = 24 << 20
    source = tmp_path / "big file.bin"
    digest = random_file(source, size)
    saved = asyncio.Event()
    browser.chromium.listen(
        lambda method, params, _s: (
            saved.set()
            if method == "Browser.downloadProgress" and params.get("state") == "completed"
            else None
        )
    )
    async with asyncio.timeout(90):
        await open_page(page, webchat.url)
        await page.set_files("#pick", [source])
        up = await transfer_done(page, "upload", source.name)
        assert up["sha256"] == digest
        assert sha256(webchat.files / source.name) == digest  # on the server's disk
        assert int(up["done"]) == size

        await page.wait_for(f"document.querySelector('#listing button.get[data-name={js(source.name)}]')")
        await page.evaluate(
            f"document.querySelector('#listing button.get[data-name={js(source.name)}]').click()"
        )
        down = await transfer_done(page, "download", source.name)
        assert down["sha256"] == digest
        await saved.wait()  # the browser saved the file
        assert sha256(browser.downloads / source.name) == digest  # on the browser's disk
    print(
        f"\nbrowser throughput, {size >> 20} MiB: upload {up['mbps']} MB/s ({up['ms']} ms), "
        f"download {down['mbps']} MB/s ({down['ms']} ms)"
    )
    assert page.errors == []


async def test_transfers_at_once_and_chat_stays_responsive(
    browser: Browser, webchat: WebChatServer, tmp_path: Path
) -> None:
    page = browser.page
    uploads = {f"up-{i}.bin": random_file(tmp_path / f"up-{i}.bin", (4 + i) << 20) for i in range(3)}
    downloads = {f"down-{i}.bin": random_file(webchat.files / f"down-{i}.bin", 6 << 20) for i in range(2)}
    held = "held.bin"
    downloads[held] = random_file(webchat.files / held, 16 << 20)
    async with asyncio.timeout(120):
        await open_page(page, webchat.url + "?nick=web&room=lobby")
        await page.wait_for("document.querySelector('ol[data-room=lobby] li.joined')")
        session, term = await terminal(webchat, "term")
        async with session:
            await term.join("lobby")
            await page.wait_for(
                f"document.querySelectorAll('#listing button.get').length === {len(downloads)}"
            )
            # Everything at once: a download held at once (paused: the page stops reading it),
            # two downloads, two uploads from the file input and one dropped on the page.
            await page.evaluate(
                f"""document.querySelector('#listing button.get[data-name={js(held)}]').click()
                document.querySelector('.transfer[data-name={js(held)}] button.pause').click()
                for (const name of {js([n for n in downloads if n != held])})
                    document.querySelector(`#listing button.get[data-name="${{name}}"]`).click()"""
            )
            await page.set_files("#pick", [tmp_path / "up-0.bin", tmp_path / "up-1.bin"])
            await page.drop_files("#messages", [tmp_path / "up-2.bin"])

            # Chat both ways while the transfers run and the held download waits.
            await say_in_page(page, "while transferring")
            await message_at_terminal(term, "lobby", "web", "while transferring")
            await term.say("lobby", "terminal still here")
            echo = await message_in_page(page, "lobby", "term", "terminal still here")
            assert echo
            state = await page.evaluate(
                f"document.querySelector('.transfer[data-name={js(held)}]').dataset.state"
            )
            assert state == "running"  # chat went through while that download was held

            rows = [await transfer_done(page, "upload", name) for name in uploads]
            for (name, digest), row in zip(uploads.items(), rows, strict=True):
                assert row["sha256"] == digest
                assert sha256(webchat.files / name) == digest
            for name, digest in downloads.items():
                if name != held:
                    assert (await transfer_done(page, "download", name))["sha256"] == digest
            own = await message_in_page(page, "lobby", "web", "while transferring")

            await page.evaluate(
                f"document.querySelector('.transfer[data-name={js(held)}] button.pause').click()"
            )
            assert (await transfer_done(page, "download", held))["sha256"] == downloads[held]

            # Cancel: a download held by the page, then cancelled there, ends on the server too.
            row = f".transfer[data-name={js(held)}]:not([data-state=done])"
            await page.evaluate(
                f"""document.querySelector('#listing button.get[data-name={js(held)}]').click()
                document.querySelector({js(row + " button.pause")}).click()"""
            )

            async def held_on_server() -> bool:
                return bool((await webchat.stats())["downloads"])

            await poll(held_on_server, "download held on the server")
            await page.evaluate(f"document.querySelector({js(row + ' button.cancel')}).click()")
            cancelled = f".transfer[data-name={js(held)}][data-state=cancelled]"
            info = await page.wait_for(
                f"document.querySelector({js(cancelled)})?.querySelector('.info').textContent"
            )
            assert info.startswith("Cancelled at ") and " of 16.8 MB" in info, info

            async def gone_from_server() -> bool:
                return not (await webchat.stats())["downloads"]

            await poll(gone_from_server, "end of the cancelled download on the server")
    print(f"\nchat round trip from the page during the transfers: {own['rttMs']} ms")
    assert page.errors == []


async def test_slow_page_throttles_the_server(browser: Browser, webchat: WebChatServer) -> None:
    page = browser.page
    name = "stream.bin"
    size = 96 << 20
    digest = random_file(webchat.files / name, size)
    async with asyncio.timeout(120):
        await open_page(page, webchat.url)
        await page.wait_for(f"document.querySelector('#listing button.get[data-name={js(name)}]')")
        rss_before = (await webchat.stats())["rss"]
        # Start the download and pause it in the same task: the page reads the header and
        # at most one chunk, then stops reading.
        await page.evaluate(
            f"""document.querySelector('#listing button.get[data-name={js(name)}]').click()
            document.querySelector('.transfer[data-name={js(name)}] button.pause').click()"""
        )
        channel = f"webchat.transfers.find(t => t.name === {js(name)}).channel"

        async def settled() -> dict[str, Any] | None:
            """Both ends once nothing is in flight: the server waits on drain() and the page
            has received every byte the server put on the wire."""
            stats = await webchat.stats()
            downloads = stats["downloads"]
            if stats["served"]:
                raise AssertionError(f"the server finished sending {name} to a page that had stopped reading")
            if not downloads:
                return None  # not started yet
            server = downloads[0]
            got = await page.evaluate(
                f"(c => c && {{received: c.received, buffered: c.buffered}})({channel})"
            )
            if not got or not server["waiting"] or server["on_wire"] != got["received"]:
                return None
            return {"server": server, "page": got, "rss": stats["rss"]}

        seen: list[tuple[int, int]] = []

        async def stable() -> dict[str, Any] | None:
            """Settled, and nothing moved since the previous check (a round trip earlier)."""
            now = await settled()
            seen.append((now["server"]["sent"], now["page"]["received"]) if now else (-1, -1))
            return now if now and len(seen) > 1 and seen[-1] == seen[-2] else None

        first = await poll(stable, "quiescent download (server waiting, all it sent received, twice)")

        server, got = first["server"], first["page"]
        consumed = got["received"] - got["buffered"]  # what the page's reader took
        assert got["buffered"] <= WINDOW
        assert server["sent"] <= consumed + WINDOW + WRITE_BUFFER_HIGH + CHUNK, (server, got)
        assert server["sent"] < size // 8
        if rss_before is not None:
            assert first["rss"] - rss_before < 32 << 20, (rss_before, first["rss"])

        await page.evaluate(f"document.querySelector('.transfer[data-name={js(name)}] button.pause').click()")
        row = await transfer_done(page, "download", name)
        assert row["sha256"] == digest
    print(
        f"\nheld download: the server had read {server['sent'] / 2**20:.2f} MiB of {size >> 20} MiB, "
        f"the page {consumed / 2**20:.2f} MiB; then {row['mbps']} MB/s"
    )
    assert page.errors == []
