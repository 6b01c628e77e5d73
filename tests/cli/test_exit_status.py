"""The one exit-status table (``polymux.apps.common.EXIT_STATUS``, docs/cli.md, the README),
checked row by row on the commands and the examples: each situation the table names ends
with its status. Ctrl-C (130) is in test_first_hour.py."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from polymux.apps.common import EXIT_FAILED, EXIT_NO_SESSION, EXIT_OK, EXIT_STATUS, EXIT_USAGE
from polymux.cli import main

from .procs import ROOT, Procs


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    yield port


def _status(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse
        assert isinstance(exc.code, int)
        return exc.code


def test_the_documented_table_is_the_one_in_every_help() -> None:
    rows = re.findall(r"^\| (\d+) \| ", (ROOT / "docs/cli.md").read_text(), re.MULTILINE)
    assert [int(r) for r in rows] == [int(c) for c in re.findall(r"^  (\d+) ", EXIT_STATUS, re.MULTILINE)]
    assert [int(r) for r in rows] == [0, 1, 2, 3, 130]


def test_missing_and_unreadable_inputs_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\xff" * 64)
    connect = ["connect", "--protocol", "yamux", "--tcp", "127.0.0.1:9"]
    for argv in (
        [*connect, "--file", str(tmp_path / "nosuch")],
        [*connect, "--file", str(empty)],
        ["decode", str(tmp_path / "nosuch")],
        ["decode", str(junk)],  # no format fits its bytes
        ["analyze", str(junk), "--out", str(tmp_path / "report")],  # not a capture
        ["analyze", str(tmp_path / "nosuch"), "--out", str(tmp_path / "report")],
    ):
        assert _status(argv) == EXIT_FAILED, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("\n") == 1, (argv, err)


def test_a_server_that_cannot_listen_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert _status(["serve", "--protocol", "yamux", "--tcp", f"127.0.0.1:{port}"]) == EXIT_FAILED
    assert f"cannot listen on tcp:127.0.0.1:{port}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["connect", "--tcp", "127.0.0.1:9"],  # --protocol missing
        ["connect", "--protocol", "nosuch", "--tcp", "127.0.0.1:9"],
        ["connect", "--protocol", "yamux", "--tcp", "127.0.0.1:9", "--window", "1"],  # below the minimum
        ["connect", "--protocol", "yamux", "--tcp", "127.0.0.1"],  # no port
        ["demo", "--files", "0"],
        ["decode", "-p", "nonsense", "x.pcap"],
        ["bridge", "yamux:tcp:127.0.0.1:0", "nosuch:tcp:127.0.0.1:1"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert _status(argv) == EXIT_USAGE
    assert "error: " in capsys.readouterr().err


def test_no_session_exits_3(closed_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["connect", "--protocol", "yamux", "--tcp", f"127.0.0.1:{closed_port}", "--timeout", "10"]
    assert _status(argv) == EXIT_NO_SESSION
    assert f"cannot connect to tcp:127.0.0.1:{closed_port} (yamux)" in capsys.readouterr().err


# -- the examples, as subprocesses -------------------------------------------------------


async def test_send_exits_1_for_a_path_that_is_not_there(procs: Procs, closed_port: int) -> None:
    send = await procs.example(
        "filetransfer/send.py", "--protocol", "yamux", "--tcp", f"127.0.0.1:{closed_port}", "/nonexistent/x"
    )
    assert await send.wait() == EXIT_FAILED, send.describe()
    assert "send: cannot read /nonexistent/x: no such file or directory" in send.stderr


async def test_send_exits_2_for_bad_arguments(procs: Procs, tmp_path: Path, closed_port: int) -> None:
    send = await procs.example(
        "filetransfer/send.py",
        "--protocol",
        "yamux",
        "--tcp",
        f"127.0.0.1:{closed_port}",
        tmp_path,
        "--as",
        "x",
    )
    assert await send.wait() == EXIT_USAGE, send.describe()
    assert "--as NAME needs exactly one file" in send.stderr and "Traceback" not in send.stderr


@pytest.mark.parametrize(
    ("script", "args"),
    [
        (
            "filetransfer/send.py",
            ["--protocol", "yamux", "--tcp", "127.0.0.1:{port}", str(ROOT / "README.md")],
        ),
        (
            "chat/client.py",
            ["--protocol", "yamux", "--tcp", "127.0.0.1:{port}", "--nick", "a", "--say", "hi"],
        ),
        ("echo.py", ["client", "--protocol", "yamux", "--port", "{port}"]),
    ],
)
async def test_examples_exit_3_without_a_session(
    procs: Procs, closed_port: int, script: str, args: list[str]
) -> None:
    proc = await procs.example(script, *(a.format(port=closed_port) for a in args))
    assert await proc.wait() == EXIT_NO_SESSION, proc.describe()
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("protocol", ["omnistreams", "omnistreams-legacy", "yamux", "streamux", "mplex"])
async def test_echo_example_works_on_every_kind_of_format(procs: Procs, protocol: str) -> None:
    """Two-way and one-way formats alike (omnistreams printed 9 tracebacks), exit 0."""
    proc = await procs.example("echo.py", "both", "--protocol", protocol, "--channels", "3")
    assert await proc.wait() == EXIT_OK, proc.describe()
    assert proc.stderr == "" and "channel 2: hello from channel 2" in proc.stdout, proc.describe()
