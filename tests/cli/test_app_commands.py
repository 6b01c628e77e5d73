"""The applications as commands of the package (issue 40, item 1): ``polymux webchat``,
``polymux chat`` (the terminal client, and ``--server``), ``polymux send`` / ``receive``, run
as a user runs them (``python -m polymux``, subprocesses on loopback and unix sockets).
The examples are thin wrappers over the same commands; tests/examples exercises them."""

from __future__ import annotations

import asyncio
import signal
import urllib.request
from pathlib import Path

import pytest

from polymux.apps.common import EXIT_OK, EXIT_USAGE
from polymux.apps.webchat import WEB_PAGE

from .procs import ROOT, Procs


async def _get(url: str) -> bytes:
    def get() -> bytes:
        with urllib.request.urlopen(url, timeout=10) as answer:
            body: bytes = answer.read()
            return body

    return await asyncio.to_thread(get)


async def test_webchat_serves_the_page_and_a_terminal_client_joins(
    procs: Procs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``polymux webchat``: the page from the package, uploads in the user's data folder, and
    the printed command for terminals (``polymux chat ...``) joins the same rooms."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    server = await procs.polymux("webchat", "--tcp", "127.0.0.1:0", "--web", "127.0.0.1:0")
    page = await server.line(r"web page on (http://127\.0\.0\.1:\d+/) \(files in (.*)\)$")
    assert Path(page.group(2)) == tmp_path / "data" / "polymux" / "webchat-files"
    hint = await server.line(r"terminal clients join with: .* -m polymux chat (.*)$")
    command = hint.group(1).split()
    assert command[:2] == ["--protocol", "mstream-v3"] and command[2] == "--tcp"
    assert await _get(page.group(1)) == (WEB_PAGE / "index.html").read_bytes()
    assert await _get(page.group(1) + "chat.js") == (WEB_PAGE / "chat.js").read_bytes()

    assert command[-4:] == ["--nick", "NAME", "--room", "lobby"]
    client = await procs.polymux("chat", *command[:-3], "ada", "--say", "hello from a terminal")
    assert await client.wait() == EXIT_OK, client.describe()
    assert "[#lobby] ada: hello from a terminal" in client.out, client.describe()
    server.send_signal(signal.SIGTERM)
    assert await server.wait() == EXIT_OK, server.describe()
    assert "chat: stopped" in server.stdout


async def test_chat_server_and_client_over_a_unix_socket(procs: Procs, short_tmp: Path) -> None:
    """``polymux chat --server`` (any two-way format) and two clients, one waiting for the
    other's message."""
    sock = short_tmp / "chat.sock"
    server = await procs.polymux("chat", "--server", "--protocol", "yamux", "--unix", sock)
    await server.line(rf"chat: yamux on unix:{sock}$")
    common = ("--protocol", "yamux", "--unix", str(sock), "--room", "dev")
    bob = await procs.polymux("chat", *common, "--nick", "bob", "--until", "hi bob", name="bob")
    await bob.line(r"joined #dev as bob")
    ada = await procs.polymux("chat", *common, "--nick", "ada", "--say", "hi bob", name="ada")
    assert await ada.wait() == EXIT_OK, ada.describe()
    assert await bob.wait() == EXIT_OK, bob.describe()
    assert "[#dev] ada: hi bob" in bob.out, bob.describe()
    server.send_signal(signal.SIGINT)
    assert await server.wait() == EXIT_OK, server.describe()
    assert not sock.exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["chat", "--say", "hi"], "the client needs --nick NAME"),
        (["chat", "--nick", "a", "--queue", "3"], "--queue is an option of the server"),
        (["chat", "--server", "--tcp", "127.0.0.1:0", "--nick", "a"], "--nick is an option of the client"),
        (["chat", "--nick", "a", "--tcp", "127.0.0.1:1", "--unix", "/tmp/x"], "not both"),
        (["chat", "--server"], "give --tcp HOST:PORT, --unix PATH and/or --web HOST:PORT"),
        (["webchat", "--allow-host", "a/b"], "--allow-host: not a host name: 'a/b'"),
        (["send", "--protocol", "yamux", "--tcp", "127.0.0.1:1"], "the following arguments are required"),
        (["receive", "--protocol", "yamux", "--tcp", "127.0.0.1:0"], "--dest"),
    ],
)
async def test_bad_arguments_exit_2_with_one_reason(procs: Procs, args: list[str], says: str) -> None:
    proc = await procs.polymux(*args)
    assert await proc.wait() == EXIT_USAGE, proc.describe()
    assert says in proc.stderr and "Traceback" not in proc.stderr, proc.describe()


async def test_send_and_receive(procs: Procs, tmp_path: Path) -> None:
    """``polymux receive`` and ``polymux send``: a tree of files, each verified; sent again,
    every file is unchanged."""
    outbox = tmp_path / "outbox"
    (outbox / "docs").mkdir(parents=True)
    (outbox / "docs" / "a.txt").write_bytes(b"polymux " * 10_000)
    (outbox / "b.bin").write_bytes(bytes(range(256)) * 300)
    inbox = tmp_path / "inbox"
    receiver = await procs.polymux(
        "receive", "--protocol", "mstream-v3", "--tcp", "127.0.0.1:0", "--dest", inbox
    )
    port = (await receiver.line(r"receive: mstream-v3 on tcp:127\.0\.0\.1:(\d+), into ")).group(1)
    for unchanged in (0, 2):
        send = await procs.polymux(
            "send", "--protocol", "mstream-v3", "--tcp", f"127.0.0.1:{port}", outbox, "--progress", "none"
        )
        assert await send.wait() == EXIT_OK, send.describe()
        assert f"unchanged {unchanged}, failed 0" in send.stdout, send.describe()
    assert (inbox / "docs" / "a.txt").read_bytes() == (outbox / "docs" / "a.txt").read_bytes()
    assert (inbox / "b.bin").read_bytes() == (outbox / "b.bin").read_bytes()
    receiver.send_signal(signal.SIGTERM)
    assert await receiver.wait() == EXIT_OK, receiver.describe()
    assert "2 files received, 2 unchanged" in receiver.stdout, receiver.describe()


def test_the_examples_are_thin_wrappers_of_the_commands() -> None:
    """The product is in the package: each example script runs its command."""
    for script, command in [
        ("chat/server.py", '["chat", "--server", *sys.argv[1:]]'),
        ("chat/client.py", '["chat", *sys.argv[1:]]'),
        ("filetransfer/send.py", '["send", *sys.argv[1:]]'),
        ("filetransfer/receive.py", '["receive", *sys.argv[1:]]'),
    ]:
        text = (ROOT / "examples" / script).read_text()
        assert f"sys.exit(main({command}))" in text, script
        assert len(text.splitlines()) < 40, script
