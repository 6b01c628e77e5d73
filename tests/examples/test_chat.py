"""examples/chat run as a user runs it: a server on TCP and a unix socket at once, three
clients, one of which stops reading. The others keep getting every message, and the slow
one is handled by the stated policy (``disconnect``: reset with the reason, the room is
told; ``drop``: it misses messages and is told exactly how many)."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

import pytest

from cli.procs import EXAMPLES, PY, Proc, Procs
from polymux.apps.common import EXIT_FAILED, EXIT_NO_SESSION, EXIT_USAGE


MESSAGES = 3000


async def start_server(procs: Procs, tmp: Path, protocol: str, *args: str) -> tuple[Proc, str, str]:
    sock = tmp / "chat.sock"
    server = await procs.example(
        "chat/server.py", "--protocol", protocol, "--tcp", "127.0.0.1:0", "--unix", str(sock), *args
    )
    tcp = await server.line(r" on tcp:(\S+)$")
    await server.line(r" on unix:")
    return server, tcp.group(1), str(sock)


async def client(procs: Procs, protocol: str, where: list[str], nick: str, *args: str) -> Proc:
    return await procs.example(
        "chat/client.py", "--protocol", protocol, *where, "--nick", nick, *args, name=nick
    )


SMALL_WINDOW = {"mstream-v3": "16K", "mstream-v2": "16K", "yamux": "256K"}
"""A slow client's window: yamux's streams start at 256 KiB, smaller is refused there."""


@pytest.mark.parametrize("protocol", ["mstream-v3", "yamux"])
async def test_three_clients_one_stops_reading(procs: Procs, short_tmp: Path, protocol: str) -> None:
    # A queue of 1024 leaves a reader that keeps up (bob) a wide margin on a loaded machine.
    server, tcp, unix = await start_server(procs, short_tmp, protocol, "--queue", "1024")
    # bob reads everything (over the unix socket); carol stops reading at once (over TCP).
    bob = await client(
        procs, protocol, ["--unix", unix], "bob", "--window", "4M", "--expect", str(MESSAGES), "--quiet"
    )
    await bob.line(r"^joined #lobby as bob")
    carol = await client(
        procs,
        protocol,
        ["--tcp", tcp],
        "carol",
        "--window",
        SMALL_WINDOW[protocol],
        "--pause-reading-after",
        "0",
        "--expect",
        "999999",
    )
    await carol.line(r"^paused reading #lobby after 0 messages")
    # alice floods the room and waits until all her messages came back to her.
    alice = await client(
        procs, protocol, ["--tcp", tcp], "alice", "--send", str(MESSAGES), "--size", "512", "--quiet"
    )
    assert await alice.wait(timeout=60) == 0, alice.describe() + server.describe()
    assert f"{MESSAGES} of our own echoed" in alice.stdout
    # bob got every message although carol read nothing: the room was never stalled.
    assert await bob.wait(timeout=60) == 0, bob.describe()
    assert f"received {MESSAGES} messages from others" in bob.stdout
    assert "* carol left #lobby (too slow: 1024 messages queued (policy: disconnect))" in bob.stdout
    await server.line(r"^slow: disconnecting carol from #lobby: too slow: 1024 messages queued")
    assert not any("slow:" in ln and "carol" not in ln for ln in server.out), server.stdout
    # carol, once she reads again, learns that the server disconnected her.
    carol.send_signal(signal.SIGUSR1)
    assert await carol.wait(timeout=30) == EXIT_FAILED, carol.describe()
    m = re.search(r"^chat: disconnected from #lobby: .*reset by the peer(.*)$", carol.stdout, re.MULTILINE)
    assert m, carol.stdout
    if protocol == "mstream-v3":  # the format carries the reason
        assert "too slow: 1024 messages queued" in m.group(1)
    server.send_signal(signal.SIGTERM)
    assert await server.wait() == 0
    assert server.out[-1] == "chat: stopped; 1 slow members disconnected"


async def test_drop_policy_tells_the_slow_client_what_it_missed(procs: Procs, short_tmp: Path) -> None:
    protocol = "mstream-v2"
    server, tcp, unix = await start_server(procs, short_tmp, protocol, "--policy", "drop", "--queue", "64")
    bob = await client(procs, protocol, ["--tcp", tcp], "bob", "--expect", "1501", "--quiet")
    await bob.line(r"^joined #lobby")
    # carol stays until "bye", which is said only once bob has left: whether she was ever
    # put out of the room is then in bob's output for sure, not a race between two exits.
    carol = await client(
        procs, protocol, ["--unix", unix], "carol", "--window", "16K", "--pause-reading-after", "0",
        "--until", "bye", "--quiet",
    )  # fmt: skip
    await carol.line(r"^paused reading")
    alice = await client(
        procs, protocol, ["--unix", unix], "alice", "--send", "1500", "--size", "512", "--quiet"
    )
    assert await alice.wait(timeout=60) == 0, alice.describe()
    await server.line(r"^slow: carol in #lobby is behind; dropping messages for it \(policy: drop\)")
    carol.send_signal(signal.SIGUSR1)
    await carol.line(r"^\* the server dropped \d+ messages")
    dave = await client(procs, protocol, ["--tcp", tcp], "dave", "--say", "the end", "--quiet")
    assert await dave.wait() == 0, dave.describe()
    assert await bob.wait(timeout=30) == 0, bob.describe()  # 1500 + "the end", then bob left
    assert "received 1501 messages from others" in bob.stdout
    assert "carol left" not in bob.stdout  # she stayed in the room all the time bob was there
    erin = await client(procs, protocol, ["--tcp", tcp], "erin", "--say", "bye", "--quiet")
    assert await erin.wait() == 0, erin.describe()
    assert await carol.wait(timeout=30) == 0, carol.describe()
    # Nothing lost silently: what carol got plus what she was told she missed is all of it
    # (alice's 1500, "the end" and "bye").
    dropped = sum(
        int(n) for n in re.findall(r"^\* the server dropped (\d+) messages", carol.stdout, re.MULTILINE)
    )
    got = int(re.search(r"received (\d+) messages from others", carol.stdout).group(1))  # type: ignore[union-attr]
    assert dropped > 0 and got + dropped == 1502, carol.stdout
    assert "carol left #lobby (too slow" not in bob.stdout  # never evicted (she leaves at the end)


async def test_join_refused_and_bad_arguments(procs: Procs, short_tmp: Path) -> None:
    server, tcp, unix = await start_server(procs, short_tmp, "mplex")
    bob = await client(procs, "mplex", ["--tcp", tcp], "bob", "--expect", "1", "--quiet")
    await bob.line(r"^joined")
    other = await client(procs, "mplex", ["--unix", unix], "bob", "--say", "hi")
    assert await other.wait() == EXIT_FAILED
    assert "cannot join #lobby: nick 'bob' is taken in room 'lobby'" in other.stderr
    await server.line(r"^refused: join from unix socket: nick 'bob' is taken")
    ok = await client(procs, "mplex", ["--unix", unix], "eve", "--say", "hello bob", "--quiet")
    assert await ok.wait() == 0
    assert await bob.wait() == 0 and "received 1 messages from others" in bob.stdout
    bad = await procs.example("chat/server.py", "--protocol", "mplex")
    assert (
        await bad.wait() == EXIT_USAGE and "--tcp HOST:PORT, --unix PATH and/or --web HOST:PORT" in bad.stderr
    )


@pytest.mark.parametrize(("server_protocol", "client_protocol", "said"), [
    ("yamux", "mstream-v3", "the peer speaks yamux, not mstream-v3"),
    ("mstream-v3", "mstream-v2", "the server closed the connection without sending a byte"),
    ("yamux", "mstream-v2", "the peer speaks yamux, not mstream-v2"),
    ("mstream-v2", "yamux", "the peer speaks mstream-v2, not yamux"),  # the server's handshake fails
])  # fmt: skip
async def test_client_of_another_format_says_so(
    procs: Procs, short_tmp: Path, server_protocol: str, client_protocol: str, said: str
) -> None:
    """The wrong --protocol: no traceback, the no-session exit status, and the message says
    what the server speaks (the tracing detector), whether or not the format has a handshake."""
    server, tcp, _unix = await start_server(procs, short_tmp, server_protocol)
    ada = await client(procs, client_protocol, ["--tcp", tcp], "ada", "--say", "hi")
    assert await ada.wait() == EXIT_NO_SESSION, ada.describe()
    assert said in ada.stderr and "Traceback" not in ada.stderr, ada.stderr
    # The server logs the bad session in one line, not as a traceback of a future nobody awaited.
    server.send_signal(signal.SIGTERM)
    assert await server.wait() == 0
    assert "never retrieved" not in server.stderr and "Traceback" not in server.stderr, server.stderr


async def test_interactive_client_two_rooms_over_streamux(procs: Procs, short_tmp: Path) -> None:
    """What a person does: type lines (one to another room with ``#room``), then end the
    input. Streamux, whose channels are request/response, carries the chat too."""
    protocol = "streamux"
    _server, tcp, unix = await start_server(procs, short_tmp, protocol)
    bob = await client(
        procs, protocol, ["--tcp", tcp], "bob", "--room", "lobby", "--room", "dev", "--expect", "2"
    )
    await bob.line(r"^joined #dev as bob")
    ada = await procs.start(
        PY, EXAMPLES / "chat/client.py", "--protocol", protocol, "--unix", unix, "--nick", "ada",
        "--room", "lobby", "--room", "dev", name="ada", stdin=asyncio.subprocess.PIPE,
    )  # fmt: skip
    await ada.line(r"^joined #dev as ada; members: ada, bob")
    assert ada.proc.stdin is not None
    ada.proc.stdin.write(b"hello all\n#dev in dev now\n")
    await ada.proc.stdin.drain()
    ada.proc.stdin.close()
    assert await ada.wait() == 0, ada.describe()
    assert "[#lobby] ada: hello all" in ada.out and "[#dev] ada: in dev now" in ada.out
    assert await bob.wait() == 0, bob.describe()
    assert "[#lobby] ada: hello all" in bob.out and "[#dev] ada: in dev now" in bob.out
