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


async def test_history_means_what_is_kept_on_the_server_and_what_is_shown_on_the_client(
    procs: Procs, short_tmp: Path
) -> None:
    """``--history`` is an option of both modes: the server keeps the last N messages of each
    room (3 here), a client asks for the last N on joining (10: it gets the 3 kept), shown
    marked "(earlier)" and not counted as received."""
    sock = short_tmp / "chat.sock"
    server = await procs.polymux("chat", "--server", "--history", "3", "--unix", sock)
    await server.line(r" on unix:")
    common = ("--unix", str(sock), "--room", "dev")
    said = ["--say", "m0", "--say", "m1", "--say", "m2", "--say", "m3", "--say", "m4"]
    ada = await procs.polymux("chat", *common, "--nick", "ada", *said, name="ada")
    assert await ada.wait() == EXIT_OK, ada.describe()
    bob = await procs.polymux(
        "chat", *common, "--nick", "bob", "--history", "10", "--until", "bye", name="bob"
    )
    await bob.line(r"^joined #dev as bob")
    ada = await procs.polymux("chat", *common, "--nick", "ada", "--say", "bye", name="ada again")
    assert await ada.wait() == EXIT_OK, ada.describe()
    assert await bob.wait() == EXIT_OK, bob.describe()
    shown = [line for line in bob.out if line.startswith("[#dev] ")]
    assert shown == [
        "[#dev] ada: m2 (earlier)",
        "[#dev] ada: m3 (earlier)",
        "[#dev] ada: m4 (earlier)",
        "[#dev] ada: bye",
    ], bob.describe()
    assert bob.out[-1] == "chat: left; received 1 messages from others, 0 of our own echoed", bob.describe()
    server.send_signal(signal.SIGINT)
    assert await server.wait() == EXIT_OK, server.describe()


def test_chat_options_of_each_mode_and_their_defaults() -> None:
    """Every option of the client (reconnection included) and of the server, with the
    defaults each mode fills in; ``--ping-interval off`` reaches the client as None."""
    from polymux.cli import build_parser
    from polymux.cli.chat import check_client_args, check_server_args, client_options

    parser = build_parser()
    args = parser.parse_args(["chat", "--nick", "ada"])
    check_client_args(args.parser, args)
    assert (args.tcp, args.room, args.history) == ("127.0.0.1:9000", ["lobby"], 0)
    assert client_options(args) == {"retries": 10, "ping_interval": 15.0, "ping_timeout": 10.0, "history": 0}
    args = parser.parse_args(
        [
            "chat",
            "--nick",
            "ada",
            "--retries",
            "0",
            "--ping-interval",
            "off",
            "--ping-timeout",
            "2.5",
            "--history",
            "7",
        ]
    )
    check_client_args(args.parser, args)
    assert client_options(args) == {"retries": 0, "ping_interval": None, "ping_timeout": 2.5, "history": 7}
    args = parser.parse_args(["chat", "--nick", "ada", "--ping-interval", "0.5"])
    check_client_args(args.parser, args)
    assert client_options(args)["ping_interval"] == 0.5
    args = parser.parse_args(["chat", "--server", "--tcp", "127.0.0.1:0"])
    check_server_args(args.parser, args)
    assert (args.history, args.queue, args.policy) == (100, 256, "disconnect")
    args = parser.parse_args(["webchat", "--history", "5"])
    check_server_args(args.parser, args)
    assert args.history == 5


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["chat", "--say", "hi"], "the client needs --nick NAME"),
        (
            ["chat", "--server", "--tcp", "127.0.0.1:0", "--retries", "3"],
            "--retries is an option of the client",
        ),
        (
            ["chat", "--server", "--tcp", "127.0.0.1:0", "--ping-interval", "off"],
            "--ping-interval is an option of the client",
        ),
        (
            ["chat", "--server", "--tcp", "127.0.0.1:0", "--ping-timeout", "1"],
            "--ping-timeout is an option of the client",
        ),
        (["chat", "--nick", "a", "--retries", "-1"], "--retries must be >= 0"),
        (["chat", "--nick", "a", "--history", "-1"], "--history must be >= 0"),
        (["chat", "--server", "--tcp", "127.0.0.1:0", "--history", "-1"], "--history must be >= 0"),
        (["chat", "--nick", "a", "--ping-interval", "0"], "must be positive: '0' (or 'off')"),
        (["chat", "--nick", "a", "--ping-timeout", "off"], "must be a number of seconds: 'off'"),
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
