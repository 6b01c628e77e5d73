"""The web chat as a person uses it, in headless Chromium (issue 31), and the page's server
against DNS rebinding (issue 30, item 6).

* At a desktop's size (1280x800) and a phone's (390x844, touch, the viewport meta
  applied): the document is no wider than the screen, every control is at least 40 px
  both ways, messages show their time, the room's members are listed, tabs count unread
  messages, small files show in B, long names are cut with an ellipsis, a paused transfer
  shows no speed, a cancelled one says so and "Clear finished" clears. Screenshots of
  each state go to ``tmp/artifacts/webchat/`` (named at the end of pytest's output).
* The server restarts under an open page: the page says so in plain words, disables the
  input, comes back by itself (no reload), joins its room again and finishes the upload
  and the download that were cut, from where the server was.
* A reload keeps the tab's nick, rooms, the room's recent messages and the file list; a
  second tab sees new files at once, and the room is told.
* Input is checked: blank nicks, blank messages, long pastes (sent as a file on request),
  renaming after joining (done, or refused with the reason), a room the server closes
  (its reason shown, Join works again).
* A closed tab is a leave in the server's log, not an error.
* A page of another site that rebinds its name to 127.0.0.1 gets 421s for the page's
  data and cannot open the WebSocket; the same page with its name allowed could (so the
  check is what stops it).

Every wait is for a condition (a DOM change, an output line, a record), bounded in time.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest

from cli.procs import Procs
from polymux.apps.chat import MAX_TEXT, ChatClient
from polymux.apps.webchat import WEB_PAGE

from .cdp import Page
from .conftest import Browser, WebChatServer, launch_browser
from .test_webchat import (
    join_another,
    message_at_terminal,
    message_in_page,
    poll,
    random_file,
    say_in_page,
    sha256,
    terminal,
    transfer_done,
)


pytestmark = [pytest.mark.browser, pytest.mark.timeout(150)]

SCREENS = {"desktop": (1280, 800, False), "phone": (390, 844, True)}
"""Width, height (CSS pixels) and whether it is a phone (touch, viewport meta)."""

TAP = 40
"""Smallest tap target, both ways (px)."""

OVERFLOW = """(() => {
    const clipped = e => {  // inside a scroller that fits the screen (the room tabs): cut off, not sticking out
        for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
            const r = a.getBoundingClientRect()
            if (getComputedStyle(a).overflowX !== 'visible' && r.left >= -0.5 && r.right <= innerWidth + 0.5) return true
        }
        return false
    }
    const sticking = [...document.querySelectorAll('body *')].filter(e => {
        const r = e.getBoundingClientRect()
        return r.width > 0 && getComputedStyle(e).visibility !== 'hidden' && (r.right > innerWidth + 0.5 || r.left < -0.5) && !clipped(e)
    }).map(e => `${e.tagName.toLowerCase()}#${e.id}.${e.className} ${Math.round(e.getBoundingClientRect().right)}`)
    return {document: document.documentElement.scrollWidth, body: document.body.scrollWidth,
            screen: innerWidth, sticking: sticking.slice(0, 10)}
})()"""
"""How wide the document is, against the screen, and the visible elements that stick out
(a closed panel waits off the screen, hidden; tabs scrolled out of their strip are cut off)."""

TAP_TARGETS = """(() => {
    const targets = [...document.querySelectorAll('a[href], button, input, textarea, select, summary, [role=tab]')]
        .filter(e => {
            const r = e.getBoundingClientRect()
            return r.width > 0 && r.height > 0 && getComputedStyle(e).visibility !== 'hidden'
        })
    const small = targets.map(e => {
        const r = e.getBoundingClientRect()
        const what = `${e.tagName.toLowerCase()}${e.id ? '#' + e.id : ''}.${e.className} "${(e.textContent || e.value || '').trim().slice(0, 20)}"`
        return {what, width: Math.round(r.width * 10) / 10, height: Math.round(r.height * 10) / 10}
    }).filter(t => t.width < TAP - 0.5 || t.height < TAP - 0.5)
    return {checked: targets.length, small}
})()""".replace("TAP", str(TAP))
"""Every visible control, and those smaller than TAP px either way."""

JARGON = re.compile(r"WebSocket|1006|omnistreams|STREAM_|OmnistreamsError|code \d{4}")
"""What a person should never have to read on the page."""


def js(value: object) -> str:
    import json

    return json.dumps(value)


async def joined(page: Page, room: str, prefix: str = "") -> str:
    """Wait until the page has joined ``room``, its latest join notice starting with
    ``prefix``; the notice's text."""
    text: str = await page.wait_for(
        f"""(o => {{
                const last = o && [...o.querySelectorAll('li.joined .text')].pop()?.textContent
                return last && last.startsWith({js(prefix)}) && last
            }})(document.querySelector('ol[data-room={js(room)}]'))"""
    )
    return text


async def submit_join(page: Page, nick: str | None, room: str) -> None:
    nick_part = f"document.querySelector('#nick').value = {js(nick)};" if nick is not None else ""
    await page.evaluate(
        f"{nick_part} document.querySelector('#room').value = {js(room)};"
        "document.querySelector('#join').requestSubmit()"
    )


async def rename(page: Page, nick: str) -> None:
    """Change the nick as a person does once in a room: tap it, type, Change."""
    await page.evaluate("document.querySelector('#me').click()")
    await page.wait_for("document.querySelector('#nick-dialog').open")
    await page.evaluate(
        f"document.querySelector('#new-nick').value = {js(nick)}; document.querySelector('#rename').requestSubmit()"
    )


async def check_layout(page: Page, screen: str, controls: int) -> dict[str, Any]:
    """No horizontal overflow and no small control (of at least ``controls``); the figures."""
    width = SCREENS[screen][0]
    overflow = await page.evaluate(OVERFLOW)
    assert overflow["screen"] == width, overflow
    assert overflow["document"] <= width and overflow["body"] <= width, overflow
    assert overflow["sticking"] == [], overflow
    targets = await page.evaluate(TAP_TARGETS)
    assert targets["small"] == [], f"controls under {TAP} px on the {screen}: {targets['small']}"
    assert targets["checked"] >= controls, targets  # the page's controls were there to check
    return {"overflow": overflow, "targets": targets["checked"]}


async def visible_text(page: Page) -> str:
    text: str = await page.evaluate("document.body.innerText")
    return text


@pytest.mark.parametrize("screen", SCREENS)
async def test_layout_fits_the_screen(
    browser: Browser, webchat: WebChatServer, tmp_path: Path, artifacts: Path, screen: str
) -> None:
    width, height, phone = SCREENS[screen]
    page = browser.page
    (webchat.files / "small.txt").write_bytes(b"hello")
    long_name = "quarterly-report-" * 6 + "final-v2.pdf"
    random_file(webchat.files / long_name, 300_000)
    random_file(webchat.files / "held.bin", 8 << 20)
    upload = tmp_path / "notes.txt"
    upload.write_text("notes\n")
    long_room = "a-room-with-a-name-as-long-as-the-server-allows-sixty-four-chars"
    assert len(long_room) == 64
    async with asyncio.timeout(90):
        await page.set_screen(width, height, phone=phone)
        await page.goto(webchat.url)
        await page.wait_for("document.querySelector('#status').dataset.state === 'ok'")
        assert await page.evaluate("document.activeElement.id") == "nick"  # focus on load
        await page.wait_for("document.querySelectorAll('#listing button.get').length === 3")
        layout = await check_layout(page, screen, 4)
        await page.screenshot(artifacts / f"{screen}-1-start.png")

        await submit_join(page, "web", "lobby")
        await joined(page, "lobby")
        assert await page.evaluate("document.activeElement.id") == "text"  # ready to type
        session, term = await terminal(webchat, "term")
        async with session:
            await term.join("lobby")
            await term.join(long_room)
            await page.wait_for("document.querySelector('#members [data-nick=term]')")
            await term.say("lobby", "hello from the terminal")
            await term.say("lobby", "a link: https://example.org/" + "x" * 300)
            await term.say("lobby", "three\nlines\nhere")
            await say_in_page(page, "hello from the page")
            await message_in_page(page, "lobby", "web", "hello from the page")
            await message_in_page(page, "lobby", "term", "three\nlines\nhere")
            members = await page.evaluate(
                "[...document.querySelectorAll('#members li')].map(li => li.textContent)"
            )
            assert members == ["term", "web (you)"]
            # The time shows once per sender and minute (term's three, then ours), and every
            # message keeps its own (on hover, on tap, and in its title).
            times = await page.evaluate(
                """[...document.querySelectorAll('ol[data-room=lobby] li.msg time')]
                   .filter(t => t.getBoundingClientRect().width > 0)
                   .map(t => [t.textContent, t.dateTime])"""
            )
            runs = await page.evaluate(
                """[...document.querySelectorAll('ol[data-room=lobby] li.msg')].filter(li => {
                    const p = li.previousElementSibling
                    return !p || !p.matches('li.msg') || p.dataset.nick !== li.dataset.nick || p.dataset.minute !== li.dataset.minute
                }).length"""
            )
            # 2 (term's, ours), or 3 if term's three straddled a minute's end.
            assert len(times) == runs and runs <= 3, (times, runs)
            for text, stamp in times:
                assert re.fullmatch(r"\d{1,2}:\d{2}( [AP]M)?", text), times
                assert abs(time.time() - time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))) < 86_400
            titles = await page.evaluate(
                "[...document.querySelectorAll('ol[data-room=lobby] li.msg')].map(li => li.title)"
            )
            assert len(titles) == 4 and all(re.search(r"\d{1,2}:\d{2}", t) for t in titles), titles

            # A second room with the longest name; the lobby counts what comes meanwhile.
            await join_another(page, long_room)
            await joined(page, long_room)
            await term.say("lobby", "while you were away")
            badge = await page.wait_for("document.querySelector('.tab[data-room=lobby] .badge').textContent")
            assert badge == "1"
            assert await page.evaluate("document.title") == "(1) polymux chat"

            # Transfers: an upload (the room is told), a held download, a cancelled one.
            await page.set_files("#pick", [upload])
            await transfer_done(page, "upload", upload.name)
            notice = await page.wait_for(
                f"document.querySelector('ol[data-room={js(long_room)}] li.file.own')?.getAttribute('aria-label')"
            )
            assert notice == "You shared notes.txt (6 B)"
            await page.wait_for("document.querySelector('#listing li[data-name=\"notes.txt\"]')")
            sizes = await page.evaluate(
                "Object.fromEntries([...document.querySelectorAll('#listing li[data-name]')]"
                ".map(li => [li.dataset.name, li.querySelector('.size').textContent]))"
            )
            assert sizes == {
                "held.bin": "8.4 MB",
                long_name: "300 KB",
                "notes.txt": "6 B",
                "small.txt": "5 B",
            }
            name = await page.evaluate(
                f"(e => [e.scrollWidth, e.clientWidth, getComputedStyle(e).textOverflow])"
                f"(document.querySelector('#listing li[data-name={js(long_name)}] .name'))"
            )
            assert name[0] > name[1] and name[2] == "ellipsis", name  # cut, with an ellipsis
            await page.evaluate(
                """document.querySelector('#listing button.get[data-name="held.bin"]').click()
                document.querySelector('.transfer[data-name="held.bin"] button.pause').click()"""
            )
            await page.evaluate(
                f"""document.querySelector('#listing button.get[data-name={js(long_name)}]').click()
                document.querySelector('.transfer[data-name={js(long_name)}] button.pause').click()
                document.querySelector('.transfer[data-name={js(long_name)}] button.cancel').click()"""
            )
            await page.wait_for(
                f"document.querySelector('.transfer[data-name={js(long_name)}][data-state=cancelled]')"
            )
            held = await page.wait_for(
                "(i => i && i.includes('paused') && i)"
                "(document.querySelector('.transfer[data-name=\"held.bin\"] .info')?.textContent)"
            )
            assert "MB/s" not in held and re.fullmatch(r"[\d.]+ (B|KB|MB) of 8.4 MB · paused", held), held

            if phone:  # the transfers are one tap away
                await page.screenshot(artifacts / f"{screen}-2-room.png")
                await page.evaluate("document.querySelector('#open-files').click()")
                await page.wait_for("document.body.classList.contains('side-open')")
            layout = await check_layout(page, screen, 12)
            transfer_name = await page.evaluate(
                f"(e => [e.scrollWidth > e.clientWidth, e.getBoundingClientRect().right <= innerWidth])"
                f"(document.querySelector('.transfer[data-name={js(long_name)}] .name'))"
            )
            assert transfer_name == [True, True]
            await page.screenshot(artifacts / f"{screen}-2-room-and-transfers.png")
            if phone:
                await page.evaluate("document.querySelector('#close-side').click()")

            await page.evaluate("document.querySelector('.tab[data-room=lobby] .select').click()")
            assert (
                await page.evaluate("document.querySelector('.tab[data-room=lobby] .badge').textContent")
                == ""
            )
            assert await page.evaluate("document.title") == "polymux chat"
            await page.evaluate("document.querySelector('#clear').click()")
            left = await page.evaluate(
                "[...document.querySelectorAll('.transfer')].map(t => t.dataset.state)"
            )
            assert left == ["running"]  # only the held download; done and cancelled are gone
            await check_layout(page, screen, 8)
            await page.screenshot(artifacts / f"{screen}-3-lobby.png")
            assert not JARGON.search(await visible_text(page))
    print(
        f"\n{screen}: {width}x{height}, document {layout['overflow']['document']} px wide, {layout['targets']} controls >= {TAP} px"
    )
    assert page.errors == []


async def test_reconnect_after_a_server_restart(
    browser: Browser, webchat: WebChatServer, tmp_path: Path, artifacts: Path
) -> None:
    page = browser.page
    source = tmp_path / "up.bin"
    up_digest = random_file(source, 12 << 20)
    down_digest = random_file(webchat.files / "down.bin", 12 << 20)
    async with asyncio.timeout(120):
        await page.set_screen(*SCREENS["desktop"][:2])
        await page.goto(webchat.url + "?nick=web&room=lobby")
        await joined(page, "lobby")
        await page.evaluate("window.notReloaded = true")
        # An upload and a download, each paused after its first bytes.
        pause_after_first_bytes = """(name => new Promise(resolve => {
            const check = () => {
                const row = document.querySelector(`.transfer[data-name="${name}"]`)
                if (row && +row.dataset.done > 0) {
                    row.querySelector('button.pause').click()
                    observer.disconnect()
                    resolve(+row.dataset.done)
                }
            }
            const observer = new MutationObserver(check)
            observer.observe(document, {subtree: true, childList: true, attributes: true})
            check()
        }))"""
        paused_up = page.evaluate(f"{pause_after_first_bytes}('up.bin')")
        await page.set_files("#pick", [source])
        await paused_up
        await page.wait_for("document.querySelector('#listing button.get[data-name=\"down.bin\"]')")
        paused_down = page.evaluate(f"{pause_after_first_bytes}('down.bin')")
        await page.evaluate("document.querySelector('#listing button.get[data-name=\"down.bin\"]').click()")
        await paused_down
        part = webchat.files / "up.bin.polymux-part"

        async def part_written() -> bool:
            return await asyncio.to_thread(lambda: part.exists() and part.stat().st_size > 0)

        await poll(part_written, "bytes of the upload on the server's disk")

        await webchat.stop()
        status = await page.wait_for(
            "(s => s.dataset.state === 'offline' && s.textContent.trim())(document.querySelector('#status'))"
        )
        assert re.fullmatch(r"Connection lost\. Trying again in \d+ s\.\s+Retry now", status), status
        assert await page.evaluate(
            "[document.querySelector('#text').disabled, document.querySelector('#join-button').disabled]"
        ) == [True, True]
        await page.wait_for(
            "[...document.querySelectorAll('ol[data-room=lobby] li.notice .text')].some(t => t.textContent.startsWith('Connection lost.'))"
        )
        # Resumed while offline: they wait for the connection.
        await page.evaluate("document.querySelectorAll('.transfer button.pause').forEach(b => b.click())")
        await page.wait_for(
            "[...document.querySelectorAll('.transfer')].every(t => t.dataset.state === 'waiting')"
        )
        text = await visible_text(page)
        assert not JARGON.search(text), text
        assert "waiting for the connection" in text
        await page.screenshot(artifacts / "reconnect-1-offline.png")

        started = time.monotonic()
        await webchat.start_again()
        await page.wait_for("document.querySelector('#status').dataset.state === 'ok'", timeout=40)
        back_after = time.monotonic() - started
        await joined(page, "lobby", "You are back in #lobby as web")
        assert await page.evaluate("window.notReloaded") is True
        up = await transfer_done(page, "upload", "up.bin")
        down = await transfer_done(page, "download", "down.bin")
        assert up["sha256"] == up_digest and sha256(webchat.files / "up.bin") == up_digest
        assert down["sha256"] == down_digest
        assert int(up["resumedFrom"]) > 0 and int(down["resumedFrom"]) > 0  # not from the start
        session, term = await terminal(webchat, "term")
        async with session:
            await term.join("lobby")
            await say_in_page(page, "after the restart")
            await message_at_terminal(term, "lobby", "web", "after the restart")
            await term.say("lobby", "welcome back")
            await message_in_page(page, "lobby", "term", "welcome back")
        assert await page.evaluate("document.querySelector('#text').disabled") is False
        await page.screenshot(artifacts / "reconnect-2-back.png")
    print(
        f"\nreconnected {back_after:.1f} s after the server started again; upload resumed at "
        f"{int(up['resumedFrom']) / 2**20:.2f} MiB, download at {int(down['resumedFrom']) / 2**20:.2f} MiB"
    )
    assert page.errors == []


async def test_reload_keeps_the_room_and_new_files_show_everywhere(
    browser: Browser, webchat: WebChatServer, tmp_path: Path, artifacts: Path
) -> None:
    ada = browser.page
    note = tmp_path / "agenda.txt"
    note.write_text("1. polymux\n")
    async with asyncio.timeout(90):
        await ada.set_screen(*SCREENS["desktop"][:2])
        await ada.goto(webchat.url)
        await ada.wait_for("document.querySelector('#status').dataset.state === 'ok'")
        await submit_join(ada, "ada", "lobby")
        await joined(ada, "lobby")
        session, term = await terminal(webchat, "term")
        async with session:
            await term.join("lobby")
            await term.say("lobby", "said before the reload")
            await say_in_page(ada, "ada was here")
            await message_in_page(ada, "lobby", "ada", "ada was here")

            # Another tab joins: it sees what was said (the room's recent messages).
            bob = await browser.chromium.new_page()
            await bob.set_screen(*SCREENS["phone"][:2], phone=True)
            await bob.goto(webchat.url + "?nick=bob&room=lobby")
            await joined(bob, "lobby")
            shown = await bob.evaluate(
                "[...document.querySelectorAll('ol[data-room=lobby] li.msg, ol[data-room=lobby] li.notice')].map(li => li.classList.contains('joined') ? 'JOINED' : li.querySelector('.text').textContent)"
            )
            assert shown[:3] == ["said before the reload", "ada was here", "JOINED"], shown

            # ada uploads: bob's list shows the file at once, and the room is told.
            await ada.set_files("#pick", [note])
            await transfer_done(ada, "upload", note.name)
            await bob.wait_for(
                "document.querySelector('#listing li.fresh button.get[data-name=\"agenda.txt\"]')"
            )
            told = await bob.wait_for(
                "document.querySelector('ol[data-room=lobby] li.file')?.getAttribute('aria-label')"
            )
            assert told == "ada shared agenda.txt (11 B)"
            await bob.evaluate("document.querySelector('ol[data-room=lobby] li.file button.get').click()")
            got = await transfer_done(bob, "download", note.name)
            assert got["sha256"] == sha256(note)
            record = await message_at_terminal_kind(term, "lobby", "file")
            assert (record["nick"], record["name"], record["size"]) == ("ada", "agenda.txt", 11)

            # ada reloads: same nick, same room, the messages and the files are still there.
            await ada.reload()
            await joined(ada, "lobby", "You are back in #lobby as ada")
            await ada.wait_for("document.querySelector('#listing button.get[data-name=\"agenda.txt\"]')")
            texts = await ada.evaluate(
                "[...document.querySelectorAll('ol[data-room=lobby] li.msg .text, ol[data-room=lobby] li.file .text')].map(t => t.textContent)"
            )
            assert texts == ["said before the reload", "ada was here", "agenda.txt"], texts
            assert await ada.evaluate("document.querySelector('#me-name').textContent") == "ada"
            await say_in_page(ada, "after the reload")
            await message_at_terminal(term, "lobby", "ada", "after the reload")
            await ada.screenshot(artifacts / "reload-ada.png")
            await bob.screenshot(artifacts / "reload-bob.png")
    assert ada.errors == [] and bob.errors == []
    log = webchat.proc.out
    assert not [line for line in log if line.startswith(("error", "failed"))], log


async def message_at_terminal_kind(client: ChatClient, room: str, kind: str) -> dict[str, Any]:
    while True:
        record = await client.read(room)
        assert record is not None, f"the server closed #{room}"
        if record["type"] == kind:
            return record


async def test_input_is_checked(browser: Browser, webchat: WebChatServer, artifacts: Path) -> None:
    page = browser.page
    async with asyncio.timeout(90):
        await page.set_screen(*SCREENS["desktop"][:2])
        await page.goto(webchat.url)
        await page.wait_for("document.querySelector('#status').dataset.state === 'ok'")
        # A nick of spaces: refused, with a message, and no room opens.
        await submit_join(page, "   ", "dev")
        refusal = await page.wait_for("document.querySelector('#notice [data-topic=join]').textContent")
        assert refusal == "Type a nick first."
        assert await page.evaluate(
            "[document.querySelectorAll('.tab').length, document.activeElement.id]"
        ) == [0, "nick"]
        # "#dev" with spaces around is the room dev.
        await submit_join(page, "ada", "  #dev ")
        await joined(page, "dev")
        assert await page.evaluate("document.querySelector('#notice [data-topic=join]').textContent") == ""
        session, term = await terminal(webchat, "term")
        async with session:
            await term.join("dev")
            # A message of spaces is not sent (Send stays off; submitting does nothing).
            await page.evaluate(
                "document.querySelector('#text').value = '   '; document.querySelector('#text').dispatchEvent(new Event('input'))"
            )
            assert await page.evaluate("document.querySelector('#send').disabled") is True
            await say_in_page(page, "   ")
            await say_in_page(page, "the first real one")
            first = await message_at_terminal_kind(term, "dev", "msg")
            assert first["text"] == "the first real one"  # nothing before it

            # A long paste: refused with the reason, kept in the box, sent as a file on request.
            await page.evaluate(
                "document.querySelector('#text').value = 'x'.repeat(20000); document.querySelector('#text').dispatchEvent(new Event('input'))"
            )
            hint = await page.wait_for("document.querySelector('#say-hint.bad')?.textContent")
            assert hint == "This message has 20,000 characters; a message has at most 16,384.Send as a file"
            await page.evaluate("document.querySelector('#say').requestSubmit()")
            assert await page.evaluate("document.querySelector('#text').value.length") == 20000
            await page.screenshot(artifacts / "input-long-paste.png")
            await page.evaluate("document.querySelector('#say-hint button.as-file').click()")
            row = await page.wait_for(
                "[...document.querySelectorAll('.transfer[data-kind=upload]')].map(r => ({...r.dataset})).find(d => d.state === 'done')"
            )
            assert re.fullmatch(r"message-[\dT-]+\.txt", row["name"]) and int(row["done"]) == 20000, row
            assert (webchat.files / row["name"]).read_text() == "x" * 20000
            told = await message_at_terminal_kind(term, "dev", "file")
            assert (told["nick"], told["name"], told["size"]) == ("ada", row["name"], 20000)
            assert await page.evaluate(
                "[document.querySelector('#text').value, document.querySelector('#say-hint').textContent]"
            ) == ["", ""]
            # At the limit (in characters, 2 bytes each in UTF-8): sent whole.
            await say_in_page(page, "é" * MAX_TEXT)
            assert (await message_at_terminal_kind(term, "dev", "msg"))["text"] == "é" * MAX_TEXT

            # Renaming after joining: done in the room, the terminal sees it.
            await rename(page, "ada2")
            renamed = await message_at_terminal_kind(term, "dev", "renamed")
            assert (renamed["old"], renamed["nick"]) == ("ada", "ada2")
            await page.wait_for("document.querySelector('#members li.me')?.textContent === 'ada2 (you)'")
            await say_in_page(page, "as ada2")
            said = await message_at_terminal_kind(term, "dev", "msg")
            assert (said["nick"], said["text"]) == ("ada2", "as ada2")
            # ... or refused, with the reason: the nick is taken.
            await rename(page, "term")
            why = await page.wait_for(
                "[...document.querySelectorAll('ol[data-room=dev] li.notice .text')].map(t => t.textContent).find(t => t.startsWith('Your nick stays'))"
            )
            assert why == "Your nick stays ada2 here: nick 'term' is taken in room 'dev'."
            status = await page.wait_for(
                "(t => t.startsWith('Your nick stays') && t)(document.querySelector('#notice [data-topic=nick]').textContent)"
            )
            assert status == "Your nick stays ada2: nick 'term' is taken in room 'dev'."
            assert (
                await page.evaluate("document.querySelector('#me-name').textContent") == "ada2"
            )  # back to the nick in use

            # The server closes the room (here: after a record it cannot use): the reason
            # shows, the input is off, and Rejoin (or "+" and the room's name) brings it back.
            await page.evaluate(
                "import('/records.js').then(r => webchat.rooms.get('dev').channel.write(r.encodeRecord({type: 'bogus'})))"
            )
            closed = await page.wait_for(
                "document.querySelector('ol[data-room=dev] li.closed .text')?.textContent"
            )
            assert closed == (
                "#dev is closed: the server closed the room after a record it cannot use "
                "(unknown record type 'bogus')."
            )
            assert await page.evaluate(
                "[document.querySelector('.tab[data-room=dev]').classList.contains('closed'), document.querySelector('#text').disabled]"
            ) == [True, True]
            assert "Rejoin" in await page.evaluate("document.querySelector('#text').placeholder")
            await page.screenshot(artifacts / "input-closed-room.png")
            await page.evaluate("document.querySelector('ol[data-room=dev] li.closed button.rejoin').click()")
            await joined(page, "dev", "You are back in #dev as ada2")
            assert await page.evaluate("document.querySelectorAll('.tab[data-room=dev]').length") == 1
            await say_in_page(page, "back again")
            await message_at_terminal(term, "dev", "ada2", "back again")
    assert page.errors == []


async def test_closing_the_tab_is_a_leave_not_an_error(browser: Browser, webchat: WebChatServer) -> None:
    page = browser.page
    random_file(webchat.files / "held.bin", 4 << 20)
    async with asyncio.timeout(60):
        session, term = await terminal(webchat, "term")
        async with session:
            await term.join("lobby")
            await page.goto(webchat.url + "?nick=web&room=lobby,dev")
            await joined(page, "lobby")
            await joined(page, "dev")
            await page.evaluate(
                """document.querySelector('#listing button.get[data-name="held.bin"]').click()
                document.querySelector('.transfer[data-name="held.bin"] button.pause').click()"""
            )
            await poll(lambda: has_download(webchat), "the held download on the server")
            await browser.chromium.send(
                "Target.closeTarget", {"targetId": await target_of(browser, webchat.url)}
            )
            left = await message_at_terminal_kind(term, "lobby", "left")
            assert (left["nick"], left["reason"]) == ("web", "left")
            await webchat.proc.line(r"^leave: web from #dev \(left\)$")
            await webchat.proc.line(r"^leave: web from #lobby \(left\)$")
    bad = [line for line in webchat.proc.out if line.startswith(("error", "failed"))]
    assert bad == [] and webchat.proc.err == [], webchat.proc.describe()


async def has_download(webchat: WebChatServer) -> bool:
    return bool((await webchat.stats())["downloads"])


async def target_of(browser: Browser, url: str) -> str:
    targets = await browser.chromium.send("Target.getTargets")
    return next(
        t["targetId"] for t in targets["targetInfos"] if t["type"] == "page" and t["url"].startswith(url)
    )


ATTACK = b"""<!doctype html><title>a page of another site</title><script>
window.attack = (async () => {
    const result = {}
    for (const path of ['/stats.json', '/']) {
        try { result[path] = (await fetch(path)).status } catch (e) { result[path] = 'failed' }
    }
    result.ws = await new Promise(resolve => {
        const ws = new WebSocket(`ws://${location.host}/ws`)
        ws.onopen = () => { ws.close(); resolve('open') }
        ws.onerror = () => resolve('refused')
    })
    return result
})()
</script>"""
"""What a DNS-rebinding page does once its name points at 127.0.0.1: use the server as
its own origin (read the stats, open the WebSocket)."""

WITHOUT_LOCAL_NETWORK_CHECKS = (
    "--disable-features=LocalNetworkAccessChecks,PrivateNetworkAccessSendPreflights,"
    "PrivateNetworkAccessRespectPreflightResults,BlockInsecurePrivateNetworkRequests"
)
"""Recent Chromium also blocks a public page's requests to loopback addresses (Local
Network Access); Firefox and Safari do not, and neither do older Chromiums. The server
must hold on its own: the test turns the browser's check off."""


async def test_dns_rebinding_page_is_refused(tmp_path: Path, webchat: WebChatServer, procs: Procs) -> None:
    """The browser resolves rebind.test to 127.0.0.1 (as after a rebinding). The attacker's
    page is served by the attacker (faked here for its own URL only); its requests to its
    own origin reach the chat server, which answers 421 and refuses the WebSocket. The
    same attack against a server told to allow rebind.test gets through: the Host check
    is what stops it."""
    chromium = await launch_browser(
        tmp_path, "--host-resolver-rules=MAP rebind.test 127.0.0.1", WITHOUT_LOCAL_NETWORK_CHECKS
    )
    try:
        async with asyncio.timeout(60):
            port = webchat.url.rstrip("/").rsplit(":", 1)[1]
            page = await chromium.new_page()
            await page.goto(f"http://rebind.test:{port}/")  # the real server, under the rebound name
            assert "does not answer for host 'rebind.test:" in await page.evaluate("document.body.innerText")
            await page.fake_response("http://rebind.test:*/attack.html", ATTACK)
            await page.goto(f"http://rebind.test:{port}/attack.html")
            assert await page.evaluate("window.attack") == {"/stats.json": 421, "/": 421, "ws": "refused"}

            allowing = await procs.example(
                "chat/server.py",
                *("--protocol", "mstream-v3", "--web", "127.0.0.1:0", "--files", str(webchat.files)),
                *("--allow-host", "rebind.test"),
                name="allowing server",
            )
            other = (await allowing.line(r"web page on http://127\.0\.0\.1:(\d+)/ ")).group(1)
            await page.goto(f"http://rebind.test:{other}/attack.html")
            assert await page.evaluate("window.attack") == {"/stats.json": 200, "/": 200, "ws": "open"}
    finally:
        await chromium.close()


def test_the_page_has_no_dependencies() -> None:
    """The page is its own files and polymux's omnistreams.js: no build step, nothing
    fetched from elsewhere."""
    web = WEB_PAGE
    for path in web.iterdir():
        text = path.read_text()
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), path
        for target in re.findall(r"""\bfrom ['"]([^'"]+)['"]""", text):
            assert target.startswith(("./", "/polymux/")), (path, target)
