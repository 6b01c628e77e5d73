"""The chat app over every format polymux speaks, with default settings: two members of
one room talk both ways (omnistreams: each room on a pair of one-way streams; Streamux: a
server that answers before the request ends, as the chat server sets it)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import polymux
from polymux.apps.chat import ChatClient, ChatServer
from polymux.apps.common import conversation_options


async def next_message(client: ChatClient, room: str) -> dict[str, Any]:
    while True:
        record = await client.read(room)
        assert record is not None, "the server closed the room"
        if record["type"] == "msg":
            return record


@pytest.mark.parametrize("protocol", polymux.PROTOCOLS)
async def test_two_members_talk_over_every_format(protocol: str) -> None:
    server = ChatServer(log=lambda line: None)
    listener = await polymux.start_server(
        server.handle, "127.0.0.1", 0, protocol=protocol, **conversation_options(protocol)
    )
    async with (
        asyncio.timeout(20),
        listener,
        await polymux.connect("127.0.0.1", listener.port, protocol=protocol) as one,
        await polymux.connect("127.0.0.1", listener.port, protocol=protocol) as two,
    ):
        alice, bob = ChatClient(one, "alice"), ChatClient(two, "bob")
        await alice.join("lobby")
        await bob.join("lobby")
        await alice.say("lobby", "hello bob")
        got = await next_message(bob, "lobby")
        assert (got["nick"], got["text"]) == ("alice", "hello bob")
        await bob.say("lobby", "hello alice")
        while (got := await next_message(alice, "lobby"))["nick"] != "bob":
            pass
        assert got["text"] == "hello alice"
        await alice.leave("lobby")
        await bob.leave("lobby")
