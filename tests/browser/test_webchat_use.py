"""The web chat as people use it, item by item of issue 41, on a phone (390x844, touch, the
viewport meta applied) and on a laptop (1280x800), in headless Chromium with a terminal
client in the same room. Screenshots of each state go to ``tmp/artifacts/webchat/``
(``<screen>-use-*.png``), for a person to look at.

1. Our own messages are ours at a glance: on the right, tinted, "You".
2. On a phone the messages take the height between a one-row header and the message box,
   which stays on the bottom edge, above the keyboard, with the newest message in view;
   people and files are one tap away. On a laptop they are beside the chat.
3. Scrolled up, new messages (and notices) do not move the list: a "N new messages" pill
   says how many and jumps to the newest; at the bottom the list follows them.
4. Links are links (``rel="noopener noreferrer"``); markup in a message stays text.
5. On a touch screen Enter is a new line and Send sends; on a keyboard Enter sends and
   Shift+Enter is a new line.
6. Once in a room, no join form: the nick is a chip that renames, "+" joins another room.
7. Offline: the status on one line, "Retry now" on one line, tabs not struck through,
   the member list marked out of date, downloads off; back, no "nobody else is here yet"
   and the people who left while we were away are gone.
8. The time once per sender and minute; each message's on hover (mouse) or tap (finger);
   on a phone no time column.
9. Files in people's words: a paper clip beside the message box opens the file dialog (no
   raw file input anywhere), one unit system, "verified" with the hash only on demand.
10. The first screen says what to do, big enough to read.

And what chat users expect besides: a typing indicator; a "New since you left" line; the
catch-up after a lost connection (the page's own, through a proxy that cuts it silently or
resets it: each missed message once, in order, marked, the lost ones counted, and what we
said as the connection went sent again and relayed once).

Every wait is for a condition (a DOM change, a record), bounded in time.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from examples.cutproxy import CutProxy
from polymux.apps.chat import ChatClient

from .cdp import Page
from .conftest import Browser, WebChatServer
from .test_webchat import join_another, message_at_terminal, message_in_page, terminal, transfer_done
from .test_webchat_page import JARGON, SCREENS, check_layout, joined, submit_join, visible_text


pytestmark = [pytest.mark.browser, pytest.mark.timeout(150)]


def js(value: object) -> str:
    import json

    return json.dumps(value)


def rect(selector: str) -> str:
    """JavaScript: the element's box as {x, y, left, right, top, bottom, width, height}, or null."""
    return f"(e => e && e.getBoundingClientRect().toJSON())(document.querySelector({js(selector)}))"


async def box(page: Page, selector: str) -> dict[str, float]:
    found: dict[str, float] | None = await page.evaluate(rect(selector))
    assert found is not None, f"no {selector} on the page"
    return found


async def visible(page: Page, selector: str) -> bool:
    """Whether ``selector`` is on the screen now (laid out, not hidden, in the viewport)."""
    return bool(
        await page.evaluate(
            f"""(e => {{
                if (!e) return false
                const r = e.getBoundingClientRect(), s = getComputedStyle(e)
                return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && r.right > 0 && r.left < innerWidth
                    && r.bottom > 0 && r.top < innerHeight
            }})(document.querySelector({js(selector)}))"""
        )
    )


async def texts(page: Page, selector: str) -> list[str]:
    found: list[str] = await page.evaluate(
        f"[...document.querySelectorAll({js(selector)})].map(e => e.textContent)"
    )
    return found


async def said(page: Page, room: str, nick: str, text: str, *, touch: bool) -> None:
    """Type ``text`` and send it the way the screen's person does (Send on a phone, Enter on a laptop)."""
    await page.evaluate("document.querySelector('#text').focus()")
    await page.type_text(text)
    if touch:
        await page.tap("#send")
    else:
        await page.press_enter()
    await message_in_page(page, room, nick, text)


async def at_bottom(page: Page) -> bool:
    return bool(
        await page.evaluate(
            "(b => b.scrollTop + b.clientHeight >= b.scrollHeight - 2)(document.querySelector('#messages'))"
        )
    )


@pytest.mark.parametrize("screen", SCREENS)
async def test_a_conversation(browser: Browser, webchat: WebChatServer, artifacts: Path, screen: str) -> None:
    width, height, phone = SCREENS[screen]
    page = browser.page
    async with asyncio.timeout(100):
        await page.set_screen(width, height, phone=phone)
        await page.goto(webchat.url)
        await page.wait_for("document.querySelector('#status').dataset.state === 'ok'")
        await submit_join(page, "web", "lobby")
        await joined(page, "lobby")
        session, term = await terminal(webchat, "term")
        async with session:
            await term.join("lobby")

            # 6. In a room: no join form; the nick is a chip, and "+" joins another room.
            assert not await visible(page, "#join") and not await visible(page, "#nick")
            assert await visible(page, "#me") and await visible(page, "#add-room")
            assert await page.evaluate("document.querySelector('#me-name').textContent") == "web"

            # 1. Ours on the right, tinted, "You"; theirs on the left.
            await said(page, "lobby", "web", "mine, on the right", touch=phone)
            await term.say("lobby", "theirs, on the left")
            await message_in_page(page, "lobby", "term", "theirs, on the left")
            list_box = await box(page, "ol[data-room=lobby]")
            mine = await box(page, "li.msg.own .bubble")
            theirs = await box(page, "li.msg:not(.own) .bubble")
            assert list_box["right"] - mine["right"] < 12 and mine["left"] > list_box["left"] + 60, (
                list_box,
                mine,
            )
            assert theirs["left"] - list_box["left"] < 12 and theirs["right"] < list_box["right"] - 60, theirs
            colours = await page.evaluate(
                "['li.msg.own .bubble', 'li.msg:not(.own) .bubble'].map(s => getComputedStyle(document.querySelector(s)).backgroundColor)"
            )
            assert colours[0] != colours[1], colours
            assert await texts(page, "li.msg.own .meta .nick") == ["You"]

            # 4. Links: clickable, opened apart; markup stays text.
            risky = (
                "see https://example.org/a_(b), <b>bold</b> <img src=x onerror=alert(1)> javascript:alert(1)"
            )
            await term.say("lobby", risky)
            shown = await message_in_page(page, "lobby", "term", risky)
            item = f"li.msg[data-seq={js(shown['seq'])}] .text"
            links = await page.evaluate(
                f"[...document.querySelectorAll({js(item + ' a')})].map(a => [a.getAttribute('href'), a.rel, a.target, a.textContent])"
            )
            assert links == [
                ["https://example.org/a_(b)", "noopener noreferrer", "_blank", "https://example.org/a_(b)"]
            ]
            assert (
                await page.evaluate(f"document.querySelectorAll({js(item + ' b, ' + item + ' img')}).length")
                == 0
            )

            # 8. The time once per sender and minute; every message's own on hover or tap.
            for i in range(4):
                await term.say("lobby", f"in a row {i}")
            await message_in_page(page, "lobby", "term", "in a row 3")
            groups = await page.evaluate(
                """(() => {
                    const items = [...document.querySelectorAll('ol[data-room=lobby] li.msg')]
                    const shown = items.filter(li => li.querySelector('.meta time').getBoundingClientRect().height > 0)
                    let runs = 0, before = null
                    for (const li of items) {
                        const key = li.dataset.nick + '/' + li.dataset.minute
                        if (key !== before || li.previousElementSibling !== document.querySelector(`li[data-seq="${+li.dataset.seq - 1}"]`)) runs++
                        before = key
                    }
                    return {messages: items.length, times: shown.length, titled: items.filter(li => /\\d:\\d\\d/.test(li.title)).length}
                })()"""
            )
            assert groups["times"] <= groups["messages"] - 3 and groups["titled"] == groups["messages"], (
                groups
            )
            # The last message that continues a run (term's six came within moments).
            await page.evaluate(
                "[...document.querySelectorAll('ol[data-room=lobby] li.msg.cont')].pop().dataset.probe = 'yes'"
            )
            row = "ol[data-room=lobby] li[data-probe]"
            assert (
                await page.evaluate(
                    f"getComputedStyle(document.querySelector({js(row + ' .when')})).visibility"
                )
                == "hidden"
            )
            if phone:
                await page.tap(row + " .bubble")
            else:
                await page.hover(row + " .bubble")
            assert (
                await page.evaluate(
                    f"getComputedStyle(document.querySelector({js(row + ' .when')})).visibility"
                )
                == "visible"
            )
            if phone:  # no time column: a message starts at the left edge
                bubble = await box(page, row + " .bubble")
                assert bubble["left"] - list_box["left"] < 12, bubble

            # The typing indicator: shown while term types, gone with its message.
            await term.send("lobby", {"type": "typing"})
            assert await page.wait_for("document.querySelector('#typing').textContent") == "term is typing…"
            await page.screenshot(artifacts / f"{screen}-use-1-conversation.png")
            await term.say("lobby", "done typing")
            await page.wait_for("document.querySelector('#typing').textContent === ''")

            # 5. Enter: a new line on a touch screen (Send sends), sends on a keyboard.
            await page.evaluate("document.querySelector('#text').focus()")
            await page.type_text("line one")
            if phone:
                await page.press_enter()
                assert await page.evaluate("document.querySelector('#text').value") == "line one\n"
                await page.type_text("line two")
                await page.tap("#send")
                await message_at_terminal(term, "lobby", "web", "line one\nline two")
                assert await page.evaluate("document.querySelector('#text').enterKeyHint") == "enter"
            else:
                await page.press_enter(shift=True)
                await page.type_text("line two")
                await page.press_enter()
                await message_at_terminal(term, "lobby", "web", "line one\nline two")
                assert await page.evaluate("document.querySelector('#text').enterKeyHint") == "send"
            assert await page.evaluate("document.querySelector('#text').value") == ""

            # 3. At the bottom the list follows; scrolled up it stays, and a pill counts.
            for i in range(40):
                await term.say("lobby", f"filler {i}")
            await message_in_page(page, "lobby", "term", "filler 39")
            assert await at_bottom(page)
            await page.evaluate(
                "(b => { b.scrollTop = 0; b.dispatchEvent(new Event('scroll')) })(document.querySelector('#messages'))"
            )
            # A notice does not move the list either; the pill offers the newest.
            s3, cat = await terminal(webchat, "cat")
            async with s3:
                await cat.join("lobby")
                pill = await page.wait_for(
                    "(p => !p.hidden && p.textContent)(document.querySelector('#new-pill'))"
                )
                assert pill == "↓ Latest"
                assert await page.evaluate("document.querySelector('#messages').scrollTop") == 0
            await term.say("lobby", "while you read back")
            pill = await page.wait_for(
                "(p => !p.hidden && p.textContent.includes('new') && p.textContent)(document.querySelector('#new-pill'))"
            )
            assert pill == "↓ 1 new message"
            assert await page.evaluate("document.querySelector('#messages').scrollTop") == 0  # did not move
            await page.screenshot(artifacts / f"{screen}-use-2-pill.png")
            await (page.tap if phone else page.click)("#new-pill")
            assert await at_bottom(page)
            assert await page.evaluate("document.querySelector('#new-pill').hidden") is True

            # "New since you left": another room for a while; the lobby marks what came.
            await join_another(page, "dev")
            await joined(page, "dev")
            await term.say("lobby", "said while you were in dev")
            assert (
                await page.wait_for("document.querySelector('.tab[data-room=lobby] .badge').textContent")
                == "1"
            )
            await (page.tap if phone else page.click)(".tab[data-room=lobby] .select")
            line = await page.evaluate(
                """(li => li && li.previousElementSibling?.textContent)(
                    [...document.querySelectorAll('ol[data-room=lobby] li.msg')].pop())"""
            )
            assert line == "New since you left"
            await page.screenshot(artifacts / f"{screen}-use-3-new-since-you-left.png")
            # 6. The chip renames everywhere.
            await (page.tap if phone else page.click)("#me")
            await page.wait_for("document.querySelector('#nick-dialog').open")
            await page.screenshot(artifacts / f"{screen}-use-4-rename.png")
            await page.evaluate("document.querySelector('#new-nick').select()")
            await page.type_text("webber")
            await page.evaluate("document.querySelector('#rename').requestSubmit()")
            renamed = await message_at_terminal_kind(term, "lobby", "renamed")
            assert (renamed["old"], renamed["nick"]) == ("web", "webber")
            await page.wait_for("document.querySelector('#me-name').textContent === 'webber'")
            assert not JARGON.search(await visible_text(page))
    assert page.errors == []


async def message_at_terminal_kind(client: ChatClient, room: str, kind: str) -> dict[str, Any]:
    while True:
        record = await client.read(room)
        assert record is not None, f"the server closed #{room}"
        if record["type"] == kind:
            return record


@pytest.mark.parametrize("screen", SCREENS)
async def test_the_screen_and_the_files(
    browser: Browser, webchat: WebChatServer, artifacts: Path, tmp_path: Path, screen: str
) -> None:
    width, height, phone = SCREENS[screen]
    page = browser.page
    (webchat.files / "report.pdf").write_bytes(b"%" * 2_500_000)
    upload = tmp_path / "holiday photo.jpg"
    upload.write_bytes(b"\xff" * 1_234_567)
    async with asyncio.timeout(100):
        await page.set_screen(width, height, phone=phone)
        await page.goto(webchat.url)
        await page.wait_for("document.querySelector('#status').dataset.state === 'ok'")

        # 10. The first screen says what to do, big enough to read.
        heading = await page.evaluate(
            "(h => [h.textContent, parseFloat(getComputedStyle(h).fontSize)])(document.querySelector('#join h2'))"
        )
        assert heading[0] == "Join a chat room" and heading[1] >= 24, heading
        lead = await page.evaluate(
            "parseFloat(getComputedStyle(document.querySelector('#join .lead')).fontSize)"
        )
        assert lead >= 16, lead
        card, chat = await box(page, "#join"), await box(page, "#chat")
        if not phone:  # in the middle of the space, not a hint in a corner
            assert abs((card["left"] + card["right"]) / 2 - (chat["left"] + chat["right"]) / 2) < 30, (
                card,
                chat,
            )
            assert abs((card["top"] + card["bottom"]) / 2 - (chat["top"] + chat["bottom"]) / 2) < 120, (
                card,
                chat,
            )
        await page.screenshot(artifacts / f"{screen}-use-0-first-screen.png")
        await submit_join(page, "web", "lobby")
        await joined(page, "lobby")

        # 2. The height: header, messages, message box; nothing else scrolls.
        header, messages, composer = (
            await box(page, "header"),
            await box(page, "#messages"),
            await box(page, "#say"),
        )
        assert abs(composer["bottom"] - height) <= 1, composer  # on the bottom edge
        assert await page.evaluate("document.scrollingElement.scrollHeight") <= height
        assert messages["top"] - header["bottom"] <= 2 and composer["top"] - messages["bottom"] <= 30
        if phone:
            assert header["height"] <= 56, header
            assert messages["height"] >= height * 0.75, messages
            # People and files: one tap away, over the chat.
            assert not await visible(page, "#members") and not await visible(page, "#listing")
            await page.tap("#open-people")
            assert await visible(page, "#members")
            await page.tap("#close-side")
            await page.tap("#open-files")
            await page.wait_for("document.querySelector('#listing button.get')")
            assert await visible(page, "#listing button.get")
            await page.tap("#close-side")
            assert await visible(page, "#text")
        else:
            assert await visible(page, "#members") and await visible(page, "#listing")

        # 9. A paper clip beside the message box opens the file dialog; no raw file input.
        assert not await visible(page, "input[type=file]")
        clip, text = await box(page, "#attach"), await box(page, "#text")
        assert clip["right"] <= text["left"] and clip["bottom"] > text["top"] and clip["top"] < text["bottom"]
        chooser = await page.file_chooser()
        await (page.tap if phone else page.click)("#attach")
        await page.choose(await asyncio.wait_for(chooser, 10), [upload])
        if phone:
            await page.tap("#open-files")
        row = await transfer_done(page, "upload", upload.name)
        info = f".transfer[data-name={js(upload.name)}] .info"
        shown = await page.evaluate(f"document.querySelector({js(info)}).innerText")
        assert re.fullmatch(r"1\.2 MB( · [\d.]+ MB/s)? · verified ✓", shown), shown
        assert row["sha256"] not in await visible_text(page)  # the hash only on demand
        await (page.tap if phone else page.click)(info + " summary")
        assert row["sha256"] in await page.evaluate(f"document.querySelector({js(info)}).innerText")
        sizes = await texts(page, "#listing .size")
        assert "2.5 MB" in sizes and "1.2 MB" in sizes, sizes
        words = await visible_text(page)
        assert not re.search(r"MiB|KiB|GiB|channel|one connection|Choose Files", words), words
        await page.screenshot(artifacts / f"{screen}-use-5-files.png")
        await check_layout(page, screen, 8)
        if phone:
            await page.tap("#close-side")

        # The room shows the file: a card with its size (and Download, for the others).
        card_text = await page.evaluate("document.querySelector('ol[data-room=lobby] li.file.own').innerText")
        assert "holiday photo.jpg" in card_text and "1.2 MB" in card_text, card_text

        # 2. The keyboard comes up (the screen shrinks): the box stays on the bottom edge and
        # the newest message in view.
        session, term = await terminal(webchat, "term")
        async with session:
            await term.join("lobby")
            for i in range(30):
                await term.say("lobby", f"line {i}")
            await message_in_page(page, "lobby", "term", "line 29")
            await page.evaluate("document.querySelector('#text').focus()")
            small = height - 340 if phone else height - 300
            await page.set_screen(width, small, phone=phone)
            await page.wait_for(
                f"Math.abs(document.querySelector('#say').getBoundingClientRect().bottom - {small}) <= 1"
            )
            newest = await page.wait_for(
                """(() => {
                    const b = document.querySelector('#messages').getBoundingClientRect()
                    const m = [...document.querySelectorAll('ol[data-room=lobby] li.msg')].pop().getBoundingClientRect()
                    return m.bottom <= b.bottom + 1 && m.top >= b.top && m.bottom - b.top
                })()"""
            )
            assert newest > 0
            await page.screenshot(artifacts / f"{screen}-use-6-keyboard.png")
            await page.set_screen(width, height, phone=phone)
    assert page.errors == []


@pytest.mark.parametrize("screen", SCREENS)
async def test_offline_and_back(
    browser: Browser, webchat: WebChatServer, artifacts: Path, screen: str
) -> None:
    """The page's connection goes through a proxy that cuts it (silently: only the page's
    ping can tell; then with a reset) while the terminal goes on talking."""
    width, height, phone = SCREENS[screen]
    page = browser.page
    web_port = int(webchat.url.rstrip("/").rsplit(":", 1)[1])
    proxy = await CutProxy.start(web_port)
    (webchat.files / "notes.txt").write_text("notes\n")
    try:
        async with asyncio.timeout(120):
            await page.set_screen(width, height, phone=phone)
            await page.goto(f"http://127.0.0.1:{proxy.port}/?nick=web&room=lobby")
            await joined(page, "lobby")
            await page.evaluate("webchat.liveness = {interval: 500, timeout: 1500}")
            session, term = await terminal(webchat, "term")
            s2, bob = await terminal(webchat, "bob")
            async with session, s2:
                await term.join("lobby")
                await bob.join("lobby")
                await term.say("lobby", "before the cut")
                await message_in_page(page, "lobby", "term", "before the cut")
                await page.wait_for("document.querySelectorAll('#listing button.get').length === 1")

                # The network stops carrying the page's bytes, and nothing says so.
                proxy.down = True
                proxy.cut_all("stall")
                await page.evaluate(
                    "document.querySelector('#text').value = 'said as the network went'; document.querySelector('#say').requestSubmit()"
                )
                await page.wait_for("document.querySelector('li.msg.own.pending')")  # shown, as sending
                status = await page.wait_for(
                    "(s => s.dataset.state === 'offline' && s.textContent.trim())(document.querySelector('#status'))",
                    20,
                )
                if phone:  # a strip of its own, short enough for one line
                    assert re.fullmatch(r"Offline\. Retrying in \d+ s\.\s+Retry now", status), status
                else:
                    assert re.fullmatch(r"Connection lost\. Trying again in \d+ s\.\s+Retry now", status), (
                        status
                    )
                await check_layout(page, screen, 4)  # nothing sticks out, every control big enough

                # 7. Offline, as a person sees it.
                status_box, retry = await box(page, "#status"), await box(page, "#retry")
                assert status_box["height"] <= 44 and retry["height"] <= 44, (
                    status_box,
                    retry,
                )  # one line each
                assert await page.evaluate(
                    "(b => b.scrollWidth <= b.clientWidth)(document.querySelector('#retry'))"
                )
                assert (await box(page, "header"))["height"] <= (92 if phone else 56)
                decoration = await page.evaluate(
                    "getComputedStyle(document.querySelector('.tab[data-room=lobby] .name')).textDecorationLine"
                )
                assert decoration == "none"  # waiting, not closed
                assert await page.evaluate(
                    "[...document.querySelectorAll('button.get')].every(b => b.disabled)"
                )  # downloads off
                assert await page.evaluate("document.querySelector('#people').classList.contains('stale')")
                if phone:
                    await page.screenshot(artifacts / f"{screen}-use-7-offline.png")
                    await page.tap("#open-people")
                    note = await page.evaluate("document.querySelector('#people-note').textContent")
                    await page.screenshot(artifacts / f"{screen}-use-7-offline-people.png")
                    await page.tap("#close-side")
                else:
                    note = await page.evaluate("document.querySelector('#people-note').textContent")
                    await page.screenshot(artifacts / f"{screen}-use-7-offline.png")
                assert note == "Offline: who is here shows again once the connection is back."

                # Meanwhile: bob leaves, term talks.
                await bob.leave("lobby")
                for i in range(5):
                    await term.say("lobby", f"while you were away {i}")
                proxy.down = False
                await (page.tap if phone else page.click)("#retry")
                back = await joined(page, "lobby", "You are back in #lobby as web")
                assert back == "You are back in #lobby as web."
                after = await page.evaluate(
                    """(() => {
                        const items = [...document.querySelectorAll('ol[data-room=lobby] li')]
                        const back = items.indexOf([...document.querySelectorAll('ol[data-room=lobby] li.joined')].pop())
                        return items.slice(back).map(li => li.textContent)
                    })()"""
                )
                assert not [t for t in after if "nobody else" in t], after
                missed = await page.wait_for(
                    """(m => m.length === 5 && m)([...document.querySelectorAll('ol[data-room=lobby] li.msg.missed .text')]
                        .map(t => t.textContent))"""
                )
                assert missed == [f"while you were away {i}" for i in range(5)]  # once each, in order
                line = await page.evaluate(
                    "document.querySelector('ol[data-room=lobby] li.msg.missed').previousElementSibling.textContent"
                )
                assert line == "5 messages while you were offline"
                # What we said as the network went: sent again, relayed once.
                await message_in_page(page, "lobby", "web", "said as the network went")
                await term.say("lobby", "end")
                seen = []
                while (record := await term.read("lobby")) is not None and record.get("text") != "end":
                    if record["type"] == "msg":
                        seen.append(record["text"])
                assert seen.count("said as the network went") == 1, seen
                assert await texts(page, "li.msg[data-nick=web] .text") == ["said as the network went"]
                members = await page.evaluate(
                    "[...document.querySelectorAll('#members li')].map(li => li.dataset.nick)"
                )
                assert members == ["term", "web"]  # bob left meanwhile
                assert await page.evaluate(
                    "[...document.querySelectorAll('button.get')].every(b => !b.disabled)"
                )
                await page.screenshot(artifacts / f"{screen}-use-8-back.png")

                # Away longer than the server's memory (100 messages a room): the rest is counted.
                proxy.down = True
                proxy.cut_all("rst")
                await page.wait_for("document.querySelector('#status').dataset.state === 'offline'", 20)
                for i in range(105):
                    await term.say("lobby", f"long away {i}")
                await message_at_terminal(term, "lobby", "term", "long away 104")
                proxy.down = False
                await (page.tap if phone else page.click)("#retry")
                lost = await page.wait_for(
                    "[...document.querySelectorAll('ol[data-room=lobby] li.notice.bad .text')].map(t => t.textContent).find(t => t.includes('no longer'))"
                )
                assert lost == "5 messages said while you were offline are no longer on the server."
                got = await page.wait_for(
                    """(m => m.length >= 100 && m)([...document.querySelectorAll('ol[data-room=lobby] li.msg .text')]
                        .map(t => t.textContent).filter(t => t.startsWith('long away')))"""
                )
                assert got == [f"long away {i}" for i in range(5, 105)]
                await page.screenshot(artifacts / f"{screen}-use-9-lost.png")
    finally:
        await proxy.close()
    assert page.errors == []
