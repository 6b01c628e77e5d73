"""Chat catches up exactly once (issue 39, item 4), at the protocol level and through
``polymux.apps.chatclient.ReconnectingChatClient``, with connections cut by a small proxy
in the test (``cutproxy``: FIN, RST, silent, stalled).

* A member that comes back with ``since`` gets ``catchup {missed, lost}`` and then each
  message it missed once, in order, marked ``missed``; what the server no longer holds is
  counted, never hidden; a restarted server (a new epoch) says the count is unknown.
* A message sent again with the same id (after a lost connection) reaches the room once;
  the sender gets ``duplicate``.
* A join with the client's token replaces the channel the server still holds for it (a
  silent cut the server has not noticed), quietly; without the token the nick is taken.
* The reconnecting client, cut every way on two formats (one without pings of its own),
  ends up with every message once, in order; its own messages said while away arrive once.

Every wait is for a condition (a record, an event, a connection), bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

import polymux
from cli.procs import Proc, Procs
from polymux.apps.chat import ChatClient, ChatServer, History, Member
from polymux.apps.chatclient import Backoff, ReconnectingChatClient

from .cutproxy import CutProxy


pytestmark = pytest.mark.timeout(60)

TOKEN = "bob-secret-token-0123456789"


class Chat:
    """An in-process chat server, its log, and a cutting proxy in front of it."""

    def __init__(self, server: ChatServer, listener: polymux.Server, proxy: CutProxy, protocol: str) -> None:
        self.server = server
        self.listener = listener
        self.proxy = proxy
        self.protocol = protocol
        self.log: list[str] = []

    async def direct(self, nick: str) -> tuple[polymux.Session, ChatClient]:
        session = await polymux.connect("127.0.0.1", self.listener.port, protocol=self.protocol)
        return session, ChatClient(session, nick)

    async def proxied(self, nick: str) -> tuple[polymux.Session, ChatClient]:
        session = await polymux.connect("127.0.0.1", self.proxy.port, protocol=self.protocol)
        return session, ChatClient(session, nick)


@contextlib.asynccontextmanager
async def chat_server(protocol: str = "mstream-v3", **options: Any) -> AsyncIterator[Chat]:
    lines: list[str] = []
    server = ChatServer(log=lines.append, **options)
    listener = await polymux.start_server(server.handle, "127.0.0.1", 0, protocol=protocol)
    proxy = await CutProxy.start(listener.port)
    chat = Chat(server, listener, proxy, protocol)
    chat.log = lines
    try:
        yield chat
    finally:
        await proxy.close()
        listener.close()
        await asyncio.wait_for(listener.wait_closed(), 10)


async def next_of(client: ChatClient, room: str, *kinds: str) -> dict[str, Any]:
    """The next record of ``room`` whose type is one of ``kinds`` (others are skipped)."""
    async with asyncio.timeout(20):
        while True:
            record = await client.read(room)
            assert record is not None, f"#{room} closed"
            if record["type"] in kinds:
                return record


async def said_all(client: ChatClient, room: str, texts: list[str]) -> list[dict[str, Any]]:
    """Say ``texts`` (ids: the texts) and wait for their echo: the server has them all."""
    for text in texts:
        await client.say(room, text, message_id=text)
    return [await next_of(client, room, "msg") for _ in texts]


# -- the server's side -------------------------------------------------------------------------


def test_history_numbers_each_room_and_counts_what_it_lost() -> None:
    history = History(per_room=3, max_bytes=10_000, max_rooms=2)
    epoch, last = history.position("a")
    assert last == 0
    for i in range(5):
        history.add("a", {"type": "msg", "text": f"a{i}", "seq": history.number("a")})
    assert history.number("b") == 1  # each room counts on its own
    assert history.position("a") == (epoch, 5)
    missed, lost = history.since("a", epoch, 1)
    assert [r["seq"] for r in missed] == [3, 4, 5] and lost == 1  # 2 is no longer held
    assert history.since("a", epoch, 5) == ([], 0)
    assert history.since("a", epoch, 99) == ([], 0)  # a number from the future: nothing
    missed, lost = history.since("a", "another epoch", 4)
    assert [r["seq"] for r in missed] == [3, 4, 5] and lost is None  # unknown
    history.number("b")
    history.position("c")  # a third room: the least recently active one ("a") is forgotten
    assert history.recent("a", 5) == [] and history.bytes == 0
    new_epoch, last = history.position("a")
    assert new_epoch != epoch and last == 0
    assert History().position("a")[0] != History().position("a")[0]  # a restart: new epochs


async def test_a_member_back_after_a_cut_gets_each_missed_message_once_in_order() -> None:
    async with chat_server(history=100) as chat:
        s1, ada = await chat.direct("ada")
        s2, bob = await chat.proxied("bob")
        async with s1, s2:
            await ada.join("lobby")
            welcome = await bob.join("lobby", token=TOKEN)
            assert (welcome["seq"], welcome["members"]) == (0, ["ada", "bob"])
            await said_all(ada, "lobby", [f"m{i}" for i in range(5)])
            got = [await next_of(bob, "lobby", "msg") for _ in range(5)]
            assert [r["seq"] for r in got] == [1, 2, 3, 4, 5]
            chat.proxy.cut("silent")  # bob's connection stops; the server does not notice
            s2.abort()  # bob gives it up
            await said_all(ada, "lobby", [f"m{i}" for i in range(5, 12)])

            s3, back = await chat.proxied("bob")
            async with s3:
                with pytest.raises(ValueError, match="nick 'bob' is taken in room 'lobby'"):
                    await back.join("lobby")  # without the token: someone else
                again = await back.join("lobby", since=5, epoch=welcome["epoch"], token=TOKEN)
                assert (again["seq"], again["epoch"], again["members"]) == (
                    12,
                    welcome["epoch"],
                    ["ada", "bob"],
                )
                assert await back.read("lobby") == {
                    "type": "catchup",
                    "room": "lobby",
                    "missed": 7,
                    "lost": 0,
                }
                missed = [await back.read("lobby") for _ in range(7)]
                assert [(r["text"], r["seq"], r["missed"]) for r in missed if r] == [
                    (f"m{i}", i + 1, True) for i in range(5, 12)
                ]
                await said_all(ada, "lobby", ["live"])
                live = await next_of(back, "lobby", "msg")
                assert (live["text"], live["seq"], "missed" in live) == ("live", 13, False)
                # The room never saw bob leave or come back: he never left.
                await ada.say("lobby", "end")
                seen = []
                while (record := await ada.read("lobby")) is not None and record.get("text") != "end":
                    seen.append(record["type"])
                assert "left" not in seen and "joined" not in seen, seen
                log = list(chat.log)
    assert [line for line in log if line.startswith("rejoin: bob in #lobby")], log
    assert not [line for line in log if line.startswith("leave: bob")], log


async def test_what_the_server_no_longer_holds_is_counted() -> None:
    async with chat_server(history=5) as chat:
        s1, ada = await chat.direct("ada")
        s2, bob = await chat.proxied("bob")
        async with s1, s2:
            await ada.join("lobby")
            welcome = await bob.join("lobby", token=TOKEN)
            await said_all(ada, "lobby", ["first"])
            assert (await next_of(bob, "lobby", "msg"))["seq"] == 1
            chat.proxy.cut("rst")
            await said_all(ada, "lobby", [f"m{i}" for i in range(12)])
            s3, back = await chat.proxied("bob")
            async with s3:
                await back.join("lobby", since=1, epoch=welcome["epoch"], token=TOKEN)
                assert await back.read("lobby") == {
                    "type": "catchup",
                    "room": "lobby",
                    "missed": 5,
                    "lost": 7,
                }
                missed = [await back.read("lobby") for _ in range(5)]
                assert [r["text"] for r in missed if r] == [f"m{i}" for i in range(7, 12)]


async def test_a_restarted_server_says_the_count_is_unknown() -> None:
    async with chat_server() as before:
        s1, bob = await before.direct("bob")
        async with s1:
            welcome = await bob.join("lobby")
            await said_all(bob, "lobby", ["before the restart"])
    async with chat_server() as after:
        s2, ada = await after.direct("ada")
        s3, back = await after.direct("bob")
        async with s2, s3:
            await ada.join("lobby")
            await said_all(ada, "lobby", ["after 1", "after 2"])
            again = await back.join("lobby", since=1, epoch=welcome["epoch"])
            assert again["epoch"] != welcome["epoch"] and again["seq"] == 2
            assert await back.read("lobby") == {"type": "catchup", "room": "lobby", "missed": 2, "lost": None}
            missed = [await back.read("lobby") for _ in range(2)]
            assert [(r["text"], r["missed"]) for r in missed if r] == [("after 1", True), ("after 2", True)]


async def delivered_late(chat: Chat, link: Any) -> None:
    """Deliver what the stalled ``link`` held from its client, end it, and wait until the
    server's session of that connection has ended (the bytes were read)."""
    where = link.server.get_extra_info("sockname")
    (session,) = [s for s in chat.listener.sessions if s.get_extra_info("peername") == where]
    await chat.proxy.release(link)
    chat.proxy.cut("fin", link)
    await asyncio.wait_for(session.wait_closed(), 20)


async def test_a_message_sent_again_reaches_the_room_once() -> None:
    async with chat_server() as chat:
        s1, ada = await chat.direct("ada")
        s2, bob = await chat.proxied("bob")
        async with s1:
            await ada.join("lobby")
            await ada.join("dev")
            epoch = (await bob.join("lobby", token=TOKEN))["epoch"]
            await bob.join("dev", token=TOKEN)
            await bob.say("lobby", "hello", message_id="id-1")
            first = await next_of(ada, "lobby", "msg")
            # bob's connection goes before his client saw the echo: it sends it again.
            chat.proxy.cut("rst")
            s2.abort()
            s3, back = await chat.proxied("bob")
            await back.join("lobby", since=0, epoch=epoch, token=TOKEN)
            await back.join("dev", token=TOKEN)
            await back.say("lobby", "hello", message_id="id-1")
            await back.say("dev", "hello", message_id="id-1")
            dup = await next_of(back, "lobby", "duplicate")
            assert dup == {"type": "duplicate", "room": "lobby", "id": "id-1", "seq": first["seq"]}
            assert (await next_of(back, "dev", "msg"))["text"] == "hello"  # another room: its own
            # A say held up by the network; the client sends it again on its next connection,
            # and the first copy arrives after all.
            chat.proxy.cut("stall")
            stalled = chat.proxy.links[-1]
            await back.say("lobby", "late", message_id="id-2")
            s3.abort()
            s4, third = await chat.proxied("bob")
            async with s4:
                await third.join("lobby", since=first["seq"], epoch=epoch, token=TOKEN)
                await third.say("lobby", "late", message_id="id-2")
                assert (await next_of(third, "lobby", "msg", "duplicate"))["text"] == "late"
                await delivered_late(chat, stalled)
                await ada.say("lobby", "end")
                texts = []
                while (record := await next_of(ada, "lobby", "msg"))["text"] != "end":
                    texts.append(record["text"])
                assert texts == ["late"]  # "hello" once (above), "late" once
                assert (await next_of(ada, "dev", "msg"))["text"] == "hello"
        assert chat.server.duplicates == 1


async def test_ping_typing_and_bad_ids() -> None:
    async with chat_server() as chat:
        s1, ada = await chat.direct("ada")
        s2, bob = await chat.direct("bob")
        async with s1, s2:
            await ada.join("lobby")
            await bob.join("lobby")
            await ada.send("lobby", {"type": "ping"})
            assert await next_of(ada, "lobby", "pong", "msg") == {"type": "pong"}
            for _ in range(3):  # at most one a second is relayed
                await ada.send("lobby", {"type": "typing"})
            await ada.say("lobby", "typed")
            records = []
            while (record := await next_of(bob, "lobby", "typing", "msg"))["type"] != "msg":
                records.append(record)
            assert records == [{"type": "typing", "room": "lobby", "nick": "ada"}]
            assert (await next_of(ada, "lobby", "typing", "msg"))["text"] == "typed"  # not to ada
            await ada.say("lobby", "x", message_id=123)  # type: ignore[arg-type]
            error = await next_of(ada, "lobby", "error", "msg")
            assert error["refused"] == "say" and "message id is a string of 1 to 64" in error["message"]
            with pytest.raises(ValueError, match="token must be 16 to 128 printable ASCII"):
                await ChatClient(s2, "cat").join("lobby", token="short")


async def test_typing_never_costs_a_seat() -> None:
    """A member whose queue is half full gets no typing notices: they never push anyone
    towards the slow-member policy."""
    server = ChatServer(log=lambda line: None, queue_size=4)
    writer: Any = None  # the members are not written to here
    busy = Member("busy", "lobby", "test", writer, asyncio.Queue(4))
    idle = Member("idle", "lobby", "test", writer, asyncio.Queue(4))
    typist = Member("typist", "lobby", "test", writer, asyncio.Queue(4))
    server.rooms["lobby"] = {m.nick: m for m in (busy, idle, typist)}
    for _ in range(2):
        busy.queue.put_nowait({"type": "msg"})
    server._typing(typist)
    server._typing(typist)  # within a second: not again
    assert (busy.queue.qsize(), idle.queue.qsize(), typist.queue.qsize()) == (2, 1, 0)
    assert idle.queue.get_nowait() == {"type": "typing", "room": "lobby", "nick": "typist"}
    assert server.evicted == 0


# -- the reconnecting client -------------------------------------------------------------------


async def collect(
    client: ReconnectingChatClient,
    until: int,
    events: list[dict[str, Any]],
    mark: int,
    reached: asyncio.Event,
) -> None:
    """Take events until ``until`` messages came (live, missed or counted lost); set
    ``reached`` once ``mark`` messages came."""
    got = lost = 0
    while got + lost < until:
        event = await client.next_event()
        assert event is not None, f"the client gave up: {events[-5:]}"
        events.append(event)
        if event["type"] == "msg" and event["nick"] == "ada":
            got += 1
            if got >= mark:
                reached.set()
        elif event["type"] == "catchup":
            lost += event["lost"] or 0


def reconnecting(chat: Chat, nick: str, **options: Any) -> ReconnectingChatClient:
    async def connect() -> polymux.Session:
        return await polymux.connect("127.0.0.1", chat.proxy.port, protocol=chat.protocol)

    # Short checks of a silent connection, but not so short that a loaded machine looks
    # like a dead server (that would only cost a reconnection, and the tests tell it apart).
    options = {
        "retries": 400,
        "backoff": Backoff(0.02, 0.2),
        "ping_interval": 1.0,
        "ping_timeout": 4.0,
        **options,
    }
    return ReconnectingChatClient(connect, nick, **options)


@pytest.mark.parametrize("protocol", ["mstream-v3", "yamux"])
@pytest.mark.parametrize("cut", ["fin", "rst", "silent"])
async def test_reconnecting_client_gets_every_message_once(protocol: str, cut: str) -> None:
    total = 300
    async with chat_server(protocol, history=1000) as chat:
        s1, ada = await chat.direct("ada")
        async with s1:
            await ada.join("lobby")
            bob = reconnecting(chat, "bob")
            await bob.start(["lobby"])
            events: list[dict[str, Any]] = []
            reached = asyncio.Event()
            reader = asyncio.ensure_future(collect(bob, total, events, 100, reached))
            await said_all(ada, "lobby", [f"m{i}" for i in range(100)])
            await asyncio.wait_for(reached.wait(), 20)
            chat.proxy.down = True  # no way back until the rest was said
            chat.proxy.cut(cut)
            await said_all(ada, "lobby", [f"m{i}" for i in range(100, total)])
            chat.proxy.down = False
            await asyncio.wait_for(reader, 40)
            await bob.close()
            await ada.leave("lobby")  # no channel open: the session closes at once (yamux)
    texts = [e["text"] for e in events if e["type"] == "msg"]
    assert texts == [f"m{i}" for i in range(total)]  # each once, in order
    missed = [e["text"] for e in events if e["type"] == "msg" and e.get("missed")]
    assert missed[-200:] == [f"m{i}" for i in range(100, total)]  # all said while away, marked
    kinds = [e["type"] for e in events]
    assert {"disconnected", "reconnecting", "reconnected", "catchup"} <= set(kinds), kinds
    assert kinds.index("disconnected") < kinds.index("reconnecting") < kinds.index("reconnected")
    assert [e for e in events if e["type"] == "catchup"][-1]["lost"] == 0


async def test_reconnecting_client_counts_what_was_lost() -> None:
    async with chat_server(history=20) as chat:
        s1, ada = await chat.direct("ada")
        async with s1:
            await ada.join("lobby")
            bob = reconnecting(chat, "bob")
            await bob.start(["lobby"])
            events: list[dict[str, Any]] = []
            reached = asyncio.Event()
            reader = asyncio.ensure_future(collect(bob, 110, events, 10, reached))
            await said_all(ada, "lobby", [f"m{i}" for i in range(10)])
            await asyncio.wait_for(reached.wait(), 20)
            chat.proxy.down = True
            chat.proxy.cut("silent")
            await said_all(ada, "lobby", [f"m{i}" for i in range(10, 110)])
            chat.proxy.down = False
            await asyncio.wait_for(reader, 40)
            await bob.close()
            await ada.leave("lobby")  # no channel open: the session closes at once (yamux)
    catchup = [e for e in events if e["type"] == "catchup"][-1]
    assert (catchup["missed"], catchup["lost"]) == (20, 80)
    texts = [e["text"] for e in events if e["type"] == "msg"]
    assert texts == [f"m{i}" for i in range(10)] + [f"m{i}" for i in range(90, 110)]


async def test_what_the_client_says_while_away_arrives_once() -> None:
    async with chat_server() as chat:
        s1, ada = await chat.direct("ada")
        async with s1:
            await ada.join("lobby")
            bob = reconnecting(chat, "bob")
            await bob.start(["lobby"])
            events: list[dict[str, Any]] = []
            # In flight when the network stalls: held by the network, delivered late.
            await bob.say("lobby", "in flight")
            assert (await next_of(ada, "lobby", "msg"))["text"] == "in flight"
            chat.proxy.cut("stall")
            stalled = chat.proxy.links[-1]
            await bob.say("lobby", "held by the network")
            chat.proxy.down = True
            async with asyncio.timeout(20):
                while (event := await bob.next_event()) and event["type"] != "disconnected":
                    events.append(event)
            for i in range(3):
                await bob.say("lobby", f"while away {i}")  # queued: sent once back
            chat.proxy.down = False
            await asyncio.wait_for(bob.delivered(), 30)
            await delivered_late(chat, stalled)  # the old connection's say arrives after all
            await ada.say("lobby", "end")
            texts = []
            while (record := await next_of(ada, "lobby", "msg"))["text"] != "end":
                texts.append(record["text"])
            await bob.close()
            await ada.leave("lobby")  # no channel open: the session closes at once (yamux)
    assert texts == ["held by the network", "while away 0", "while away 1", "while away 2"]


# -- the terminal client (examples/chat/client.py) ----------------------------------------------


async def terminal(procs: Procs, port: int, nick: str, *args: str) -> Proc:
    client = await procs.example(
        "chat/client.py",
        *("--protocol", "mstream-v3", "--tcp", f"127.0.0.1:{port}", "--nick", nick),
        *("--ping-interval", "1", "--ping-timeout", "4", "--retries", "50", *args),
        name=nick,
    )
    await client.line(rf"^joined #lobby as {nick}")
    return client


def shown(proc: Proc, nick: str) -> list[str]:
    """The messages of ``nick`` the terminal showed, in order, with their marks."""
    return [
        line.removeprefix(f"[#lobby] {nick}: ") for line in proc.out if line.startswith(f"[#lobby] {nick}: ")
    ]


@pytest.mark.parametrize("cut", ["fin", "rst", "silent"])
async def test_terminal_client_comes_back_and_shows_each_message_once(procs: Procs, cut: str) -> None:
    """MultiplexingStream has no ping of its own: a silent cut is noticed by the client's."""
    total = 300
    async with chat_server(history=1000) as chat:
        s1, ada = await chat.direct("ada")
        async with s1:
            await ada.join("lobby")
            bob = await terminal(procs, chat.proxy.port, "bob", "--expect", str(total))
            await said_all(ada, "lobby", [f"m{i}" for i in range(100)])
            await bob.line(r"^\[#lobby\] ada: m99$")
            chat.proxy.down = True
            chat.proxy.cut(cut)
            await bob.line(r"^\* connection lost: ")
            await said_all(ada, "lobby", [f"m{i}" for i in range(100, total)])
            chat.proxy.down = False
            assert await bob.wait(timeout=60) == 0, bob.describe()
            await ada.leave("lobby")
    lines = shown(bob, "ada")
    assert [line.removesuffix(" (missed)") for line in lines] == [f"m{i}" for i in range(total)]
    assert lines[100:] == [f"m{i} (missed)" for i in range(100, total)]  # said while away: all marked
    assert "* 200 messages said in #lobby while you were away:" in bob.out, bob.stdout
    assert [line for line in bob.out if line.startswith("* reconnecting (attempt 1/50, next in ")], bob.stdout
    assert re.fullmatch(
        r"chat: left; received 300 messages from others, 0 of our own echoed; came back after \d+ lost connections?",
        bob.out[-1],
    ), bob.stdout


async def test_terminal_client_says_how_many_were_lost(procs: Procs) -> None:
    async with chat_server(history=20) as chat:
        s1, ada = await chat.direct("ada")
        async with s1:
            await ada.join("lobby")
            bob = await terminal(procs, chat.proxy.port, "bob", "--expect", "30")
            await said_all(ada, "lobby", [f"m{i}" for i in range(10)])
            await bob.line(r"^\[#lobby\] ada: m9$")
            chat.proxy.down = True
            chat.proxy.cut("silent")
            await bob.line(r"^\* connection lost: no answer from the server for \d+ s$")
            await said_all(ada, "lobby", [f"m{i}" for i in range(10, 110)])
            chat.proxy.down = False
            assert await bob.wait(timeout=60) == 0, bob.describe()
            await ada.leave("lobby")
    assert (
        "* 80 messages said in #lobby while you were away are lost (the server no longer holds them)"
        in bob.out
    ), bob.stdout
    lines = shown(bob, "ada")
    kept = [f"m{i}" for i in range(10)] + [f"m{i}" for i in range(90, 110)]
    assert [line.removesuffix(" (missed)") for line in lines] == kept
    assert lines[10:] == [f"m{i} (missed)" for i in range(90, 110)]


async def test_terminal_client_after_a_server_restart(procs: Procs) -> None:
    first = ChatServer(log=lambda line: None)
    listener = await polymux.start_server(first.handle, "127.0.0.1", 0, protocol="mstream-v3")
    port = listener.port
    proxy = await CutProxy.start(port)
    try:
        bob = await terminal(procs, proxy.port, "bob", "--until", "bye")
        session = await polymux.connect("127.0.0.1", port, protocol="mstream-v3")
        ada = ChatClient(session, "ada")
        await ada.join("lobby")
        await said_all(ada, "lobby", ["before the restart"])
        await bob.line(r"^\[#lobby\] ada: before the restart$")
        proxy.down = True
        session.abort()
        listener.close()  # the server stops, and starts again (its history gone)
        await listener.wait_closed()
        await bob.line(r"^\* connection lost: ")
        second = ChatServer(log=lambda line: None)
        listener = await polymux.start_server(second.handle, "127.0.0.1", port, protocol="mstream-v3")
        async with await polymux.connect("127.0.0.1", port, protocol="mstream-v3") as again:
            ada = ChatClient(again, "ada")
            await ada.join("lobby")
            await said_all(ada, "lobby", ["after the restart"])
            proxy.down = False
            await bob.line(r"^\[#lobby\] ada: after the restart \(missed\)$")
            await said_all(ada, "lobby", ["bye"])
            assert await bob.wait(timeout=30) == 0, bob.describe()
            await ada.leave("lobby")
    finally:
        await proxy.close()
        listener.close()
        await listener.wait_closed()
    assert (
        "* the server restarted (or forgot #lobby): what was said there meanwhile may be lost" in bob.out
    ), bob.stdout
    assert shown(bob, "ada") == ["before the restart", "after the restart (missed)", "bye"]
