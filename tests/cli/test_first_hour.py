"""What a new user meets in the first hour, as subprocesses: one exit-status table for every
command (and in every --help), plain-text help, a clear message and the no-session status
for a peer of another wire format or a handshake that does not finish in --timeout, no
throughput figure for a failed run, Ctrl-C, and sizes with units parsed one way."""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import sys
from pathlib import Path

import pytest

import polymux
from polymux.apps.common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NO_SESSION,
    EXIT_STATUS,
    EXIT_USAGE,
    parse_size,
)
from polymux.cli import build_parser, main

from .procs import Procs


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


MARKUP = re.compile(r"``|`|:(class|mod|func|data|meth|attr|exc):")


def test_every_command_help_ends_with_the_one_exit_status_table() -> None:
    parser = build_parser()
    commands = _subparsers(parser)
    assert set(commands) >= {"demo", "serve", "connect", "decode", "bench", "analyze"}
    for name, sub in [("polymux", parser), *commands.items()]:
        text = sub.format_help()
        assert text.rstrip().endswith(EXIT_STATUS.rstrip()), name
        assert not MARKUP.search(text), f"{name} --help shows markup: {MARKUP.search(text)}"


@pytest.mark.parametrize(
    "script", ["chat/server.py", "chat/client.py", "filetransfer/send.py", "filetransfer/receive.py"]
)
async def test_example_help_has_the_same_table(procs: Procs, script: str) -> None:
    proc = await procs.example(script, "--help")
    assert await proc.wait() == 0, proc.describe()
    assert EXIT_STATUS.rstrip() in proc.stdout and not MARKUP.search(proc.stdout), proc.stdout


async def _silent_server() -> asyncio.Server:
    """A TCP server that accepts and never says a byte (a handshake that never comes)."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    return await asyncio.start_server(hold, "127.0.0.1", 0)


@pytest.mark.parametrize(
    ("server_protocol", "client_protocol", "said"),
    [
        ("yamux", "mstream-v3", "the peer speaks yamux, not mstream-v3"),  # no handshake: fails on data
        ("yamux", "mstream-v2", "the peer speaks yamux, not mstream-v2"),  # fails in the handshake
        ("streamux", "mplex", "the peer speaks streamux, not mplex"),
        # one-way: nothing can come back
        ("mstream-v3", "omnistreams", "the server closed the connection without sending a byte"),
        ("mplex", "yamux", "the server closed the connection without sending a byte"),
    ],
)
async def test_a_peer_of_another_format_is_named(
    procs: Procs, server_protocol: str, client_protocol: str, said: str
) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
        writer.close()

    async with await polymux.start_server(echo, "127.0.0.1", 0, protocol=server_protocol) as server:
        client = await procs.polymux(
            "connect", "--protocol", client_protocol, "--tcp", f"127.0.0.1:{server.port}",
            "--size", "64KiB", "--timeout", "20",
        )  # fmt: skip
        assert await client.wait() == EXIT_NO_SESSION, client.describe()
    assert said in client.stderr, client.stderr
    assert "MB/s" not in client.stdout and "Traceback" not in client.stderr, client.describe()


BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\nConnection: close\r\n\r\nBad Request"


@pytest.mark.parametrize(("protocol", "runs"), [("mplex", 12), ("yamux", 3), ("mstream-v2", 3)])
async def test_an_http_server_is_named_every_time(procs: Procs, protocol: str, runs: int) -> None:
    """An HTTP server answers 400 and closes with our bytes unread: the kernel resets the
    connection, and the client's next write often fails before it read the answer. The
    answer is read all the same (it said "the peer sent nothing back" in 11 of 12 runs);
    and a guess at 0.5 ("the peer speaks mplex") is never made of it."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.write(BAD_REQUEST)
        await writer.drain()
        writer.transport.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        for _ in range(runs):
            client = await procs.polymux(
                "connect",
                "--protocol",
                protocol,
                "--tcp",
                f"127.0.0.1:{port}",
                "--size",
                "64KiB",
                "--timeout",
                "10",
            )
            assert await client.wait() == EXIT_NO_SESSION, client.describe()
            assert (
                f"the peer speaks HTTP, not {protocol} (certain: it sent an HTTP response "
                '"HTTP/1.1 400 Bad Request", so it is an HTTP server)'
            ) in client.stderr, client.stderr
    finally:
        server.close()


async def test_timeout_shorter_than_the_handshake(procs: Procs) -> None:
    server = await _silent_server()
    port = server.sockets[0].getsockname()[1]
    try:
        client = await procs.polymux(
            "connect", "--protocol", "mstream-v2", "--tcp", f"127.0.0.1:{port}", "--timeout", "0.5"
        )
        assert await client.wait() == EXIT_NO_SESSION, client.describe()
    finally:
        server.close()
    assert re.search(
        r"cannot connect to tcp:127\.0\.0\.1:\d+ \(mstream-v2\) within 0\.5 s: \S", client.stderr
    )
    assert "never retrieved" not in client.stderr and "Traceback" not in client.stderr, client.stderr


async def test_ctrl_c_exits_130_without_a_traceback(procs: Procs) -> None:
    server = await procs.polymux("serve", "--protocol", "yamux", "--tcp", "127.0.0.1:0")
    addr = (await server.line(r" on tcp:(\S+)$")).group(1)
    client = await procs.polymux("connect", "--protocol", "yamux", "--tcp", addr, "--size", "100GiB")
    await server.line(r"session from", stream="err")
    client.send_signal(signal.SIGINT)
    assert await client.wait() == EXIT_INTERRUPTED, client.describe()
    assert "interrupted" in client.stderr and "Traceback" not in client.stderr, client.stderr


@pytest.mark.parametrize(
    ("text", "value"),
    [("512B", 512), ("64KiB", 64 << 10), ("64kb", 64 << 10), ("16MiB", 16 << 20), ("3T", 3 << 40)],
)
def test_sizes_take_every_unit_spelling(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_a_bad_size_names_the_option_and_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["connect", "--protocol", "yamux", "--tcp", "127.0.0.1:1", "--size", "64ib"],
        ["demo", "--total", "lots"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == EXIT_USAGE
        err = capsys.readouterr().err
        assert re.search(
            r"argument --(size|total/--size): not a size: '(64ib|lots)' \(a number of bytes ", err
        ), err


@pytest.mark.parametrize("size_args", [["--total", "96KiB"], ["--size", "98304"]])
async def test_demo_total_and_its_other_name(procs: Procs, size_args: list[str]) -> None:
    demo = await procs.polymux("demo", "--files", "3", *size_args, "--progress", "none")
    assert await demo.wait(timeout=60) == 0, demo.describe()
    assert "3 files, 96.0 KiB in all, one channel per file (3 at a time)" in demo.stdout
    # The temporary folder is gone when the demo ends: the summary does not name it.
    assert "receiver: 3 files written, 3/3 identical" in demo.stdout and "/tmp/" not in demo.stdout


def test_analyze_without_its_extras_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import polymux.pipeline

    def missing(_inputs: object, out: str, **_kwargs: object) -> object:
        Path(out).mkdir()  # as the pipeline does before it reads a pcap file (dpkt)
        raise ModuleNotFoundError("No module named 'dpkt'", name="dpkt")

    monkeypatch.setattr(polymux.pipeline, "analyze", missing)
    assert main(["analyze", str(tmp_path), "--out", str(tmp_path / "out")]) == EXIT_FAILED
    assert "pip install 'polymux[spark,pcap]'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # no empty report folder left behind


def test_analyze_without_spark_stops_before_it_creates_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "pyspark", None)  # find_spec("pyspark") -> None: not installed
    assert main(["analyze", str(tmp_path), "--out", str(tmp_path / "report")]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs pyspark, which is not installed" in err, err
    assert not (tmp_path / "report").exists()
    (tmp_path / "kept").mkdir()  # a folder that was there stays, whatever happens
    assert main(["analyze", str(tmp_path), "--out", str(tmp_path / "kept")]) == EXIT_FAILED
    assert (tmp_path / "kept").is_dir()


def test_the_report_without_matplotlib_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Plots are optional for polymux analyze: without matplotlib the page keeps its tables
    and says what to install, instead of a traceback."""
    import html
    import sys

    import pandas as pd

    from polymux.pipeline.page import PLOTS_MISSING, write_html

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ModuleNotFoundError
    tables = {
        name: pd.DataFrame() for name in ("sessions", "violations", "stalls", "traffic", "lifetimes", "pings")
    }
    tables["throughput"] = pd.DataFrame(
        {"session": ["s"], "channel": ["1"], "direction": ["c2s"], "second": [0], "bytes": [10]}
    )
    tables["stall_totals"] = pd.DataFrame({"session": ["s"], "channel": ["1"], "stalled_s": [0.5]})
    page = write_html(tmp_path, tables).read_text()
    assert html.escape(PLOTS_MISSING) in page and "pip install 'polymux[spark]'" in PLOTS_MISSING
    assert "<img" not in page and not list(tmp_path.glob("*.png"))
    assert PLOTS_MISSING in caplog.text
