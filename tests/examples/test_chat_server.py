"""``polymux.apps.chat.ChatServer`` in-process, over mstream-v3 on 127.0.0.1: what the web
page relies on beyond the terminal client's records. History on request (and only then),
renaming, refusals that leave the channel open (blank or too long messages, bad nicks),
why a member left, and a client's clean close logged as a leave, not as an error."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest

import polymux
from polymux.apps.chat import MAX_TEXT, ChatClient, ChatServer, History, check_label


pytestmark = pytest.mark.timeout(30)


class Log(list[str]):
    """The server's log lines; :meth:`line` waits for one."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def add(self, line: str) -> None:
        self.append(line)
        self.changed.set()

    async def line(self, start: str) -> str:
        """The first line starting with ``start``, once it is written (10 s at most)."""
        async with asyncio.timeout(10):
            while not (found := [line for line in self if line.startswith(start)]):
                self.changed.clear()
                await self.changed.wait()
        return found[0]


@pytest.fixture
async def chat() -> AsyncIterator[tuple[ChatServer, int, Log]]:
    lines = Log()
    server = ChatServer(log=lines.add, history=5)
    listener = await polymux.start_server(server.handle, "127.0.0.1", 0, protocol="mstream-v3")
    try:
        yield server, listener.port, lines
    finally:
        listener.close()
        await asyncio.wait_for(listener.wait_closed(), 10)


async def client(port: int, nick: str) -> tuple[polymux.Session, ChatClient]:
    session = await polymux.connect("127.0.0.1", port, protocol="mstream-v3")
    return session, ChatClient(session, nick)


async def next_of(client: ChatClient, room: str, *kinds: str) -> dict[str, Any]:
    """The next record of ``room`` whose type is one of ``kinds`` (others are skipped)."""
    async with asyncio.timeout(10):
        while True:
            record = await client.read(room)
            assert record is not None, f"#{room} closed"
            if record["type"] in kinds:
                return record


def test_labels_refuse_blank_and_padded() -> None:
    assert check_label("nick", "ada lovelace") == "ada lovelace"
    for value, why in [
        ("   ", "must not be blank"),
        (" ada", "must not start or end with a space"),
        ("ada\t", "non-printable"),
        ("", "non-empty"),
        ("x" * 65, "longer than 64"),
    ]:
        with pytest.raises(ValueError, match=why):
            check_label("nick", value)


def test_history_is_bounded_per_room_and_in_all() -> None:
    history = History(per_room=3, max_bytes=1000)
    for i in range(5):
        history.add("a", {"type": "msg", "text": f"a{i}"})
    assert [r["text"] for r in history.recent("a", 10)] == ["a2", "a3", "a4"]
    assert [r["text"] for r in history.recent("a", 2)] == ["a3", "a4"]
    assert history.recent("a", 0) == [] and history.recent("none", 5) == []
    for i in range(3):
        history.add("b", {"type": "msg", "text": "b" * 200 + str(i)})
    # 3 x 69 + 3 x 268 bytes is over 1000: the room active least recently ("a") lost
    # its oldest record.
    assert history.bytes == 2 * 69 + 3 * 268
    assert len(history.recent("b", 10)) == 3
    assert [r["text"] for r in history.recent("a", 10)] == ["a3", "a4"]
    history.add("c", {"type": "msg", "text": "c" * 2000})  # heavier than everything: not kept
    assert history.recent("c", 1) == []
    with pytest.raises(ValueError, match="history bounds must be >= 0"):
        History(per_room=-1)


async def test_history_only_on_request(chat: tuple[ChatServer, int, Log]) -> None:
    _server, port, _lines = chat
    s1, ada = await client(port, "ada")
    async with s1:
        await ada.join("lobby")
        for i in range(7):
            await ada.say("lobby", f"message {i}")
        for i in range(7):
            assert (await next_of(ada, "lobby", "msg"))["text"] == f"message {i}"
        await ada.leave("lobby")  # the room is empty now; its history stays
    s2, bob = await client(port, "bob")
    s3, cat = await client(port, "cat")
    async with s2, s3:
        welcome = await bob.join("lobby", history=3)
        assert welcome["members"] == ["bob"]
        back = [await next_of(bob, "lobby", "msg") for _ in range(3)]
        assert [r["text"] for r in back] == ["message 4", "message 5", "message 6"]
        assert all(r["history"] is True and r["nick"] == "ada" for r in back)
        assert back[0]["seq"] < back[1]["seq"] < back[2]["seq"]
        await cat.join("lobby")  # asks for none (a terminal client): gets none
        await bob.say("lobby", "live")
        live = await next_of(cat, "lobby", "msg")
        assert live["text"] == "live" and "history" not in live
        # The server keeps 5 per room: asking for more gets those.
        s4, dan = await client(port, "dan")
        async with s4:
            await dan.join("lobby", history=50)
            texts = [(await next_of(dan, "lobby", "msg"))["text"] for _ in range(5)]
            assert texts == ["message 3", "message 4", "message 5", "message 6", "live"]
            with pytest.raises(ValueError, match="history must be a count of messages"):
                await dan.join("other", history=-1)


async def test_refusals_keep_the_channel_open(chat: tuple[ChatServer, int, Log]) -> None:
    _server, port, _lines = chat
    s1, ada = await client(port, "ada")
    async with s1:
        await ada.join("lobby")
        await ada.say("lobby", "  \t ")
        assert await next_of(ada, "lobby", "error", "msg") == {
            "type": "error",
            "message": "an empty message was not sent",
            "refused": "say",
        }
        await ada.say("lobby", "x" * (MAX_TEXT + 1))
        error = await next_of(ada, "lobby", "error", "msg")
        assert error["refused"] == "say"
        assert error["message"] == "a message of 16,385 characters was not sent (at most 16,384)"
        await ada.say("lobby", "é" * MAX_TEXT)  # at the limit, in characters: sent whole
        assert (await next_of(ada, "lobby", "error", "msg"))["text"] == "é" * MAX_TEXT
        with pytest.raises(ValueError, match="nick must not be blank"):
            ChatClient(s1, "   ")


async def test_rename(chat: tuple[ChatServer, int, Log]) -> None:
    server, port, lines = chat
    s1, ada = await client(port, "ada")
    s2, bob = await client(port, "bob")
    async with s1, s2:
        await ada.join("lobby")
        await bob.join("lobby")
        await ada.rename("lobby", "bob")
        assert await next_of(ada, "lobby", "error", "renamed") == {
            "type": "error",
            "message": "nick 'bob' is taken in room 'lobby'",
            "refused": "nick",
        }
        await ada.rename("lobby", "  ")
        assert (await next_of(ada, "lobby", "error", "renamed"))["message"] == "nick must not be blank"
        await ada.rename("lobby", "ada lovelace")
        renamed = {"type": "renamed", "room": "lobby", "old": "ada", "nick": "ada lovelace"}
        assert await next_of(ada, "lobby", "error", "renamed") == renamed
        assert await next_of(bob, "lobby", "renamed") == renamed
        await ada.say("lobby", "new name")
        said = await next_of(bob, "lobby", "msg")
        assert (said["nick"], said["text"]) == ("ada lovelace", "new name")
        assert sorted(server.rooms["lobby"]) == ["ada lovelace", "bob"]
        assert "nick: ada is now ada lovelace in #lobby" in lines
        # The old nick is free again.
        s3, ada2 = await client(port, "ada")
        async with s3:
            assert (await ada2.join("lobby"))["members"] == ["ada", "ada lovelace", "bob"]


async def test_why_members_left(chat: tuple[ChatServer, int, Log]) -> None:
    _server, port, lines = chat
    s1, ada = await client(port, "ada")
    async with s1:
        await ada.join("lobby")
        s2, bob = await client(port, "bob")
        await bob.join("lobby")
        await s2.aclose()  # bob closes his connection cleanly (a page's tab closed)
        left = await next_of(ada, "lobby", "left")
        assert (left["nick"], left["reason"]) == ("bob", "left")
        s3, cat = await client(port, "cat")
        await cat.join("lobby")
        # cat's connection is cut: a reset (linger 0), as when a network path dies.
        sock = s3.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s3.abort()
        left = await next_of(ada, "lobby", "left")
        assert (left["nick"], left["reason"]) == ("cat", "connection lost")
        s4, dan = await client(port, "dan")
        await dan.join("lobby")
        await dan.leave("lobby")
        left = await next_of(ada, "lobby", "left")
        assert (left["nick"], left["reason"]) == ("dan", "left")
        await s4.aclose()
    assert await lines.line("leave: bob from #lobby") == "leave: bob from #lobby (left)"
    assert await lines.line("leave: cat from #lobby") == "leave: cat from #lobby (connection lost)"
    assert not [line for line in lines if line.startswith("error")], lines
