"""The server side of the web page, without a browser: ``polymux.web.static_files`` (the
page's files and ``omnistreams.js`` over HTTP on the WebSocket's port) and
``polymux.apps.webchat.WebChat`` (downloads, listing, refusals) driven by a polymux client
over omnistreams pairs, as the page's channels are."""

from __future__ import annotations

import asyncio
import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus

import polymux
from cli.procs import Proc, Procs
from polymux.apps.chat import ChatClient, ChatServer
from polymux.apps.records import MAX_RECORD, encode_record, read_record, write_record
from polymux.apps.webchat import WebChat
from polymux.web import CLIENT_URL, client_path, client_source, static_files


pytestmark = pytest.mark.timeout(60)


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[polymux.Server, WebChat, list[str]]]:
    lines: list[str] = []
    web = WebChat(ChatServer(log=lines.append), tmp_path / "files", log=lines.append)
    index = tmp_path / "index.html"
    index.write_text("<!doctype html><title>t</title>")
    files = {
        "/": index,
        "/gone.css": tmp_path / "missing.css",
        "/raw.bin": b"\x00\x01",
        "/stats.json": lambda: b'{"n": 1}',
    }
    server = await polymux.serve_websocket(web.handle, "127.0.0.1", 0, process_request=static_files(files))
    try:
        yield server, web, lines
    finally:
        await asyncio.wait_for(server.aclose(), 10)


def test_client_ships_in_the_package() -> None:
    assert client_path().name == "omnistreams.js"
    source = client_source()
    assert source == client_path().read_bytes()
    assert b"export async function connect" in source and b"export class Session" in source


def test_static_files_checks_its_paths() -> None:
    with pytest.raises(ValueError, match="URL paths start with '/', got 'index.html'"):
        static_files({"index.html": b""})


async def test_static_files_and_websocket_share_a_port(
    served: tuple[polymux.Server, WebChat, list[str]],
) -> None:
    server, _web, _lines = served
    base = f"http://127.0.0.1:{server.port}"
    status, kind, body = await asyncio.to_thread(get, base + "/?nick=a")  # the query is ignored
    assert (status, kind, body) == (200, "text/html; charset=utf-8", b"<!doctype html><title>t</title>")
    status, kind, body = await asyncio.to_thread(get, base + CLIENT_URL)
    assert (status, kind, body) == (200, "text/javascript; charset=utf-8", client_source())
    assert await asyncio.to_thread(get, base + "/raw.bin") == (200, "application/octet-stream", b"\x00\x01")
    assert await asyncio.to_thread(get, base + "/stats.json") == (200, "application/json", b'{"n": 1}')
    status, _kind, body = await asyncio.to_thread(get, base + "/../etc/passwd")
    assert status == 404
    status, _kind, body = await asyncio.to_thread(get, base + "/gone.css")
    assert status == 500 and b"missing.css" in body
    # A page from another site may not use the server's WebSocket; the page's own site may.
    url = f"ws://127.0.0.1:{server.port}/ws"
    with pytest.raises(InvalidStatus, match="HTTP 403"):
        await polymux.connect_websocket(url, origin="http://elsewhere.example")
    session = await polymux.connect_websocket(url, origin=f"http://127.0.0.1:{server.port}")
    await session.aclose()
    # The same port still speaks omnistreams over WebSocket.
    async with await polymux.connect_websocket(f"ws://127.0.0.1:{server.port}/ws") as session:
        reader, writer = await session.open_pair("files/list")
        write_record(writer, {"type": "list"})
        writer.write_eof()
        assert await read_record(reader) == {"type": "files", "files": [], "truncated": False}
        writer.close()


async def ask(session: polymux.Session, name: str, record: dict[str, Any]) -> tuple[Any, bytes, Any]:
    """Send ``record`` on a new pair ``name``; return the first record, the bytes after it
    (for a ``file``) and the record after those."""
    reader, writer = await session.open_pair(name)
    write_record(writer, record)
    writer.write_eof()
    first = await read_record(reader)
    data = b""
    last = None
    if first is not None and first["type"] == "file":
        data = await reader.readexactly(first["size"] - first.get("offset", 0))
        last = await read_record(reader)
    writer.close()
    return first, data, last


async def test_downloads_and_refusals(served: tuple[polymux.Server, WebChat, list[str]]) -> None:
    server, web, lines = served
    payload = os.urandom(700_000)
    (web.root / "sub").mkdir()
    (web.root / "sub" / "a.bin").write_bytes(payload)
    (web.root / "half.bin.polymux-part").write_bytes(b"x")  # a partial upload: not listed
    (web.root / "link").symlink_to(web.root / "sub" / "a.bin")
    async with await polymux.connect_websocket(f"ws://127.0.0.1:{server.port}/ws") as session:
        listing, _, _ = await ask(session, "files/list", {"type": "list"})
        assert listing == {
            "type": "files",
            "files": [{"name": "sub/a.bin", "size": 700_000}],
            "truncated": False,
        }

        head, data, end = await ask(session, "files/get", {"type": "get", "name": "sub/a.bin"})
        assert head == {"type": "file", "name": "sub/a.bin", "size": 700_000, "offset": 0}
        assert data == payload
        assert end == {"type": "end", "sha256": hashlib.sha256(payload).hexdigest()}
        assert web.served == 1 and web.downloads == {}

        for name, why in [
            ("../outside", "'..' component"),
            ("/etc/passwd", "absolute path"),
            ("nope.bin", "No such file or directory"),
            ("link", "Too many levels of symbolic links"),
        ]:
            answer, _, _ = await ask(session, "files/get", {"type": "get", "name": name})
            assert answer is not None and answer["type"] == "error", answer
            assert why in answer["message"], answer

        answer, _, _ = await ask(session, "files/get", {"type": "list"})
        assert answer == {"type": "error", "message": "expected a get record, got 'list'"}

        reader, writer = await session.open_pair("nonsense")
        with pytest.raises(polymux.ChannelReset):
            await reader.read()
        writer.close()
    assert any("a channel named 'nonsense'" in line for line in lines), lines
    assert any(line.startswith("sent: sub/a.bin (683.6 KiB") for line in lines), lines


async def raw_request(port: int, path: str, host: str | None, *, upgrade: bool = False) -> tuple[int, bytes]:
    """Send one HTTP/1.1 GET to 127.0.0.1:``port`` with ``Host: host`` (none if ``None``),
    as a WebSocket upgrade if asked (a browser's, Origin included); the status and body."""
    lines = [f"GET {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    if upgrade:
        lines += [
            "Upgrade: websocket",
            "Connection: Upgrade",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version: 13",
        ]
        if host is not None:
            lines.append(f"Origin: http://{host}")
    else:
        lines.append("Connection: close")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(10):
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
            await writer.drain()
            status = await reader.readline()
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(h.split(b":")[1])
                    for h in head.split(b"\r\n")
                    if h.lower().startswith(b"content-length:")
                ),
                0,
            )
            body = await reader.readexactly(length) if length else b""
    finally:
        writer.close()
    return int(status.split()[1]), body


async def test_dns_rebinding_foreign_hosts_are_refused(
    served: tuple[polymux.Server, WebChat, list[str]],
) -> None:
    """A page of another site whose name resolves to 127.0.0.1 (DNS rebinding) sends its
    own name in Host, and a matching Origin: the page, its data and the WebSocket upgrade
    are all refused with a 421. Loopback names and the address the server listens on are
    served; a missing or malformed Host is refused."""
    server, _web, _lines = served
    port = server.port
    for host in (
        "rebind.example",
        f"rebind.example:{port}",
        f"attacker.localhost.example:{port}",
        "127.0.0.1.nip.io",
    ):
        for path in ("/", "/stats.json", CLIENT_URL):
            status, body = await raw_request(port, path, host)
            assert status == 421, (host, path, status, body)
            assert b"does not answer for host" in body
        status, body = await raw_request(port, "/ws", host, upgrade=True)
        assert status == 421, (host, status, body)
    for host in (None, "", "a b", "[zz]:1", "rebind.example:port"):
        assert (await raw_request(port, "/", host))[0] == 421, host
    for host in (
        f"127.0.0.1:{port}",
        f"localhost:{port}",
        "LOCALHOST",
        "localhost.",
        f"[::1]:{port}",
        "app.localhost",
        "127.0.0.2",
    ):
        assert (await raw_request(port, "/", host))[0] == 200, host
        assert (await raw_request(port, "/stats.json", host))[0] == 200, host
        assert (await raw_request(port, "/ws", host, upgrade=True))[0] == 101, host


async def test_allowed_hosts_adds_names(tmp_path: Path) -> None:
    web = WebChat(ChatServer(log=lambda line: None), tmp_path / "files", log=lambda line: None)
    hook = static_files({"/": b"page"}, allowed_hosts=["Chat.Example.", "10.1.2.3"])
    with pytest.raises(ValueError, match="not a host name: 'a/b'"):
        static_files({}, allowed_hosts=["a/b"])
    server = await polymux.serve_websocket(web.handle, "127.0.0.1", 0, process_request=hook)
    try:
        port = server.port
        for host in ("chat.example", f"CHAT.example.:{port}", "10.1.2.3", f"127.0.0.1:{port}"):
            assert (await raw_request(port, "/", host))[0] == 200, host
            assert (await raw_request(port, "/ws", host, upgrade=True))[0] == 101, host
        for host in ("other.example", "sub.chat.example", "10.1.2.4"):
            assert (await raw_request(port, "/", host))[0] == 421, host
            assert (await raw_request(port, "/ws", host, upgrade=True))[0] == 421, host
    finally:
        await asyncio.wait_for(server.aclose(), 10)
    anything = static_files({"/": b"page"}, allowed_hosts="*")
    server = await polymux.serve_websocket(web.handle, "127.0.0.1", 0, process_request=anything)
    try:
        assert (await raw_request(server.port, "/", "any.example"))[0] == 200
    finally:
        await asyncio.wait_for(server.aclose(), 10)


async def upload(session: polymux.Session, name: str, data: bytes, **extra: str) -> dict[str, Any]:
    """Upload ``data`` as the page does (the file-transfer records on ``files/put``), with
    ``extra`` fields in the offer; the server's last record."""
    reader, writer = await session.open_pair("files/put")
    write_record(writer, {"type": "offer", "name": name, "size": len(data), **extra})
    accept = await read_record(reader)
    assert accept is not None and accept["type"] == "accept", accept
    write_record(writer, {"type": "start", "offset": 0})
    writer.write(data)
    write_record(writer, {"type": "end", "sha256": hashlib.sha256(data).hexdigest()})
    writer.write_eof()
    done = await read_record(reader)
    writer.close()
    assert done is not None
    return done


async def test_live_file_list_and_room_notice(served: tuple[polymux.Server, WebChat, list[str]]) -> None:
    """A page watching the file list gets the new list after every upload; the uploader's
    room hears of the file, but only when the nick is the uploader's own."""
    server, web, _lines = served
    url = f"ws://127.0.0.1:{server.port}/ws"
    async with (
        await polymux.connect_websocket(url) as watcher,
        await polymux.connect_websocket(url) as uploader,
    ):
        reader, writer = await watcher.open_pair("files/watch")
        write_record(writer, {"type": "watch"})
        assert await read_record(reader) == {"type": "files", "files": [], "truncated": False}
        ada = ChatClient(uploader, "ada")
        await ada.join("lobby")
        bob = ChatClient(watcher, "bob")
        await bob.join("lobby")

        assert (await upload(uploader, "notes.txt", b"hello", room="lobby", nick="ada"))["type"] == "done"
        listing = await read_record(reader)
        assert listing == {"type": "files", "files": [{"name": "notes.txt", "size": 5}], "truncated": False}
        while (record := await bob.read("lobby")) is not None and record["type"] != "file":
            pass
        assert record is not None
        assert {k: record[k] for k in ("room", "nick", "name", "size")} == {
            "room": "lobby",
            "nick": "ada",
            "name": "notes.txt",
            "size": 5,
        }
        # Naming someone else's nick (bob is on another connection): the list changes,
        # the room hears nothing.
        assert (await upload(uploader, "forged.txt", b"x", room="lobby", nick="bob"))["type"] == "done"
        assert [f["name"] for f in (await read_record(reader) or {})["files"]] == ["forged.txt", "notes.txt"]
        await ada.say("lobby", "after the forged one")
        while (record := await bob.read("lobby")) is not None and record["type"] != "msg":
            assert record["type"] != "file", record
        assert web.stats()["watchers"] == 1
        # A file that came another way shows when the list is asked for.
        (web.root / "copied.txt").write_bytes(b"cp")
        listed, _, _ = await ask(watcher, "files/list", {"type": "list"})
        assert [f["name"] for f in listed["files"]] == ["copied.txt", "forged.txt", "notes.txt"]
        writer.write_eof()  # the page stops watching
        assert await read_record(reader) is None
        async with asyncio.timeout(10):
            # The server's watcher ends as its read of the page's side sees the end: a
            # state with no event to wait on from here; the pause only paces the checks.
            while web.stats()["watchers"]:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        writer.close()


async def test_download_resumes_at_an_offset(served: tuple[polymux.Server, WebChat, list[str]]) -> None:
    server, web, lines = served
    payload = os.urandom(600_000)
    (web.root / "a.bin").write_bytes(payload)
    async with await polymux.connect_websocket(f"ws://127.0.0.1:{server.port}/ws") as session:
        head, data, end = await ask(session, "files/get", {"type": "get", "name": "a.bin", "offset": 250_000})
        assert head == {"type": "file", "name": "a.bin", "size": 600_000, "offset": 250_000}
        assert data == payload[250_000:]
        assert end == {"type": "end", "sha256": hashlib.sha256(payload).hexdigest()}  # of the whole file
        head, data, _end = await ask(
            session, "files/get", {"type": "get", "name": "a.bin", "offset": 600_000}
        )
        assert (head["offset"], data) == (600_000, b"")
        answer, _, _ = await ask(session, "files/get", {"type": "get", "name": "a.bin", "offset": 600_001})
        assert answer == {
            "type": "error",
            "message": "cannot resume 'a.bin' at byte 600,001: it has 600,000 bytes now",
        }
        answer, _, _ = await ask(session, "files/get", {"type": "get", "name": "a.bin", "offset": -1})
        assert answer == {
            "type": "error",
            "message": "record 'get': field 'offset' must be an int >= 0, got -1",
        }
    assert any(
        line.startswith("sent: a.bin (585.9 KiB, sha256") and "resumed at 244.1 KiB" in line for line in lines
    )


def test_listing_fits_in_one_record(tmp_path: Path) -> None:
    web = WebChat(ChatServer(log=lambda line: None), tmp_path, log=lambda line: None)
    for i in range(300):
        (tmp_path / f"{i:03d}-{'n' * 200}").write_bytes(b"")
    listing = web.listing_record()
    assert listing["truncated"] is True
    assert 0 < len(listing["files"]) < 300
    assert len(encode_record({"type": "files", **listing})) <= MAX_RECORD


async def start_example(procs: Procs, *args: str) -> tuple[Proc, int]:
    """examples/chat/server.py with its page on a free port of 127.0.0.1, as a user starts
    it; the process and the page's port."""
    server = await procs.example(
        "chat/server.py", "--protocol", "mstream-v3", "--web", "127.0.0.1:0", *args, name="chat server"
    )
    port = int((await server.line(r"web page on http://127\.0\.0\.1:(\d+)/ ")).group(1))
    return server, port


async def test_example_server_answers_only_its_hosts(procs: Procs, tmp_path: Path) -> None:
    """The example as started by scripts/webchat: a DNS-rebinding page (its own name in
    Host) gets 421 for the page, /stats.json and the WebSocket; --allow-host adds a name."""
    server, port = await start_example(procs, "--files", str(tmp_path))
    for path in ("/", "/stats.json", "/chat.js"):
        assert (await raw_request(port, path, f"rebind.example:{port}"))[0] == 421, path
        assert (await raw_request(port, path, f"127.0.0.1:{port}"))[0] == 200, path
    assert (await raw_request(port, "/ws", f"rebind.example:{port}", upgrade=True))[0] == 421
    assert (await raw_request(port, "/ws", f"localhost:{port}", upgrade=True))[0] == 101
    await server.stop()
    server, port = await start_example(procs, "--files", str(tmp_path), "--allow-host", "chat.example")
    assert (await raw_request(port, "/stats.json", f"chat.example:{port}"))[0] == 200
    assert (await raw_request(port, "/ws", f"chat.example:{port}", upgrade=True))[0] == 101
    assert (await raw_request(port, "/", f"rebind.example:{port}"))[0] == 421
    bad = await procs.example(
        "chat/server.py",
        "--protocol",
        "mstream-v3",
        "--web",
        "127.0.0.1:0",
        "--allow-host",
        "a/b",
        name="bad",
    )
    assert await bad.wait() == 2
    assert "--allow-host: not a host name: 'a/b'" in bad.stderr


async def test_default_files_folder_is_kept_between_starts(
    procs: Procs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --files, uploads go to $XDG_DATA_HOME/polymux/webchat-files: the same
    folder at the next start, so the file list survives a restart."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    folder = tmp_path / "data" / "polymux" / "webchat-files"
    server, port = await start_example(procs)
    assert f"(files in {folder})" in server.stdout
    async with await polymux.connect_websocket(f"ws://127.0.0.1:{port}/ws") as session:
        assert (await upload(session, "kept.txt", b"still here"))["type"] == "done"
    await server.stop()
    server, port = await start_example(procs)
    assert f"(files in {folder})" in server.stdout
    async with await polymux.connect_websocket(f"ws://127.0.0.1:{port}/ws") as session:
        listing, _, _ = await ask(session, "files/list", {"type": "list"})
    assert listing is not None and listing["files"] == [{"name": "kept.txt", "size": 10}]
