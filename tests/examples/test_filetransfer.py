"""examples/filetransfer run as a user runs them (subprocesses on loopback and unix
sockets): 32 files with the sender killed mid-way and the transfer resumed, hostile
names refused with a clear error, and the transfer over every two-way format."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import re
import signal
from pathlib import Path

import pytest

import polymux
from cli.procs import Proc, Procs
from polymux.apps.common import conversation_options
from polymux.apps.filetransfer import (
    PART_SUFFIX,
    Receiver,
    UnsafeName,
    check_name,
    collect,
    destination,
    send_files,
)
from polymux.apps.records import read_record, write_record


def make_files(root: Path, count: int, total: int, seed: int = 7) -> dict[str, str]:
    """``count`` files of random bytes (``total`` bytes in all) in nested directories;
    returns name -> SHA-256."""
    rng = random.Random(seed)
    weights = [rng.uniform(0.2, 1.8) for _ in range(count)]
    digests = {}
    for i, w in enumerate(weights):
        name = f"d{i % 3}/sub{i % 2}/file-{i:02d}.bin"
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(int(total * w / sum(weights)))
        path.write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
    return digests


def tree_digests(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


async def start_receiver(procs: Procs, dest: Path, *args: str) -> tuple[Proc, str]:
    proc = await procs.example("filetransfer/receive.py", "--dest", dest, *args)
    m = await proc.line(r" on (?:tcp|unix):(\S+), into ")
    return proc, m.group(1)


async def test_32_files_interrupted_and_resumed(procs: Procs, short_tmp: Path) -> None:
    src, dest, sock = short_tmp / "src", short_tmp / "dest", short_tmp / "ft.sock"
    digests = make_files(src, 32, 24 * 1024 * 1024)
    receiver, _ = await start_receiver(procs, dest, "--protocol", "mstream-v3", "--unix", str(sock))
    common = ["--protocol", "mstream-v3", "--unix", str(sock), "--progress", "plain", src]

    # First attempt, rate-limited so that it is surely cut mid-way: killed at >= 40%.
    first = await procs.example("filetransfer/send.py", *common, "--limit-rate", "12M", name="send #1")
    await first.line(r"^progress +([4-9]\d)\.\d%", timeout=60)
    first.proc.kill()
    assert await first.wait() == -signal.SIGKILL
    # The receiver notices, keeps the partial files and says so (one line per file).
    await receiver.wait_for(lambda: any("interrupted:" in ln for ln in receiver.out), "an interrupted line")
    parts = sorted(p for p in dest.rglob(f"*{PART_SUFFIX}"))
    complete_before = [ln for ln in receiver.out if ln.startswith("received:")]
    assert parts, receiver.describe()
    assert len(complete_before) < 32
    assert any(p.stat().st_size > 0 for p in parts)
    interrupted = [ln for ln in receiver.out if ln.startswith("interrupted:")]
    assert all("kept" in ln and "for resume" in ln for ln in interrupted)

    # Second attempt: only what is missing is sent; everything verified end to end.
    second = await procs.example("filetransfer/send.py", *common, name="send #2")
    assert await second.wait(timeout=60) == 0, second.describe() + receiver.describe()
    m = re.search(
        r"32/32 files verified \(SHA-256\), .*; sent ([\d.]+) (MiB|KiB) in [\d.]+ s = [\d.]+ MB/s, .*"
        r"resumed (\d+) \(([\d.]+) (MiB|KiB) not re-sent\), unchanged (\d+), failed 0",
        second.stdout,
    )
    assert m, second.stdout
    resumed, unchanged = int(m.group(3)), int(m.group(6))
    assert resumed >= 1 and float(m.group(4)) > 0
    # Files completed before the kill are not sent again (a file renamed just as the
    # connection died may not have been logged as received, hence >=).
    assert len(complete_before) <= unchanged < 32
    sent_mib = float(m.group(1)) / (1 if m.group(2) == "MiB" else 1024)
    assert sent_mib < 24 * 0.85  # not everything again
    assert re.search(r"resumed at [\d.]+ (KiB|MiB)", receiver.stdout)
    # Identical trees, no partial files left.
    assert tree_digests(dest) == digests
    receiver.send_signal(signal.SIGTERM)
    assert await receiver.wait() == 0
    assert "interrupted, 0 failed" in receiver.out[-1]


async def test_the_sender_resumes_by_itself_when_the_receiver_is_restarted(
    procs: Procs, short_tmp: Path
) -> None:
    """The receiver is killed (SIGKILL) mid-way and started again a moment later on the same
    socket: the sender, left running, reconnects by itself (its progress says so) and
    completes; every file verified, the partial files resumed from disk."""
    src, dest, sock = short_tmp / "src", short_tmp / "dest", short_tmp / "ft.sock"
    digests = make_files(src, 12, 12 * 1024 * 1024)
    receiver, _ = await start_receiver(procs, dest, "--protocol", "mplex", "--unix", str(sock))
    sender = await procs.example(
        "filetransfer/send.py",
        *("--protocol", "mplex", "--unix", str(sock), "--progress", "plain", "--limit-rate", "8M", src),
        name="send",
    )
    await sender.line(r"^progress +([3-9]\d)\.\d%", timeout=60)
    receiver.proc.kill()
    assert await receiver.wait() == -signal.SIGKILL
    await sender.line(r"^reconnecting \(attempt 1/10, next in [\d.]+ s\): ", timeout=60)
    restarted, _ = await start_receiver(procs, dest, "--protocol", "mplex", "--unix", str(sock))
    assert await sender.wait(timeout=120) == 0, sender.describe() + restarted.describe()
    assert re.search(r"12/12 files verified \(SHA-256\).*resumed [1-9]", sender.stdout), sender.stdout
    assert "; reconnected " in sender.stdout
    await restarted.wait_for(
        lambda: any("resumed at" in ln for ln in restarted.out), "a file resumed from its partial file"
    )
    assert tree_digests(dest) == digests  # no partial file left, every file whole
    restarted.send_signal(signal.SIGTERM)
    assert await restarted.wait() == 0


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd"])
async def test_hostile_names_from_the_command_line(procs: Procs, short_tmp: Path, name: str) -> None:
    dest = short_tmp / "in" / "box"
    payload = short_tmp / "payload.txt"
    payload.write_text("root::0:0::/root:/bin/sh\n")
    receiver, addr = await start_receiver(procs, dest, "--protocol", "yamux", "--tcp", "127.0.0.1:0")
    sender = await procs.example(
        "filetransfer/send.py",
        "--protocol",
        "yamux",
        "--tcp",
        addr,
        payload,
        "--as",
        name,
        "--progress",
        "none",
    )
    assert await sender.wait() == 1
    why = "the name has a '..' component" if name.startswith("..") else "the name is an absolute path"
    assert f"send: error: {name!r}: refused by the receiver: unsafe name {name!r}: {why}" in sender.stderr
    assert "0/1 files verified" in sender.stdout and "failed 1" in sender.stdout
    line = await receiver.line(r"^refused: ")
    assert name in line.string and why in line.string
    assert list(dest.rglob("*")) == []
    assert sorted(p.name for p in short_tmp.iterdir()) == ["in", "payload.txt"]  # noqa: ASYNC240


HOSTILE = [
    ("", "the name is empty"),
    ("evil\0.txt", "NUL byte"),
    ("../../etc/passwd", "'..' component"),
    ("a/../../b", "'..' component"),
    ("/etc/passwd", "absolute path"),
    ("C:/Windows/win.ini", "drive letter"),
    ("c:evil", "drive letter"),
    ("..\\..\\evil", "backslash"),
    ("a//b", "empty component"),
    ("a/./b", "'.' component"),
    ("trailing/", "empty component"),
    ("tab\there", "control character"),
    ("x" * 300, "longer than 255 bytes"),
    ("y" * 1100, "longer than 1024 bytes"),
    ("f.bin" + PART_SUFFIX, "reserved"),
    (7, "must be a string"),
    ("escape/x.txt", "resolves outside"),  # escape -> a directory outside (a symlink)
]


async def test_hostile_names_over_the_wire(procs: Procs, short_tmp: Path) -> None:
    """A hostile client speaks the protocol itself: every unsafe name gets an
    ``unsafe-name`` error record naming the reason, is logged, and writes nothing."""
    dest, outside = short_tmp / "dest", short_tmp / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "escape").symlink_to(outside)
    sock = short_tmp / "h.sock"
    receiver, _ = await start_receiver(procs, dest, "--protocol", "mstream-v2", "--unix", str(sock))
    async with asyncio.timeout(30), await polymux.connect_unix(sock, protocol="mstream-v2") as session:
        for name, why in HOSTILE:
            reader, writer = await session.open_channel("polymux-file")
            write_record(writer, {"type": "offer", "name": name, "size": 5})
            await writer.drain()
            reply = await read_record(reader)
            assert reply is not None and reply["type"] == "error", (name, reply)
            assert reply["code"] == "unsafe-name" and why in reply["message"], (name, reply)
            assert await reader.read() == b""
            writer.close()
    await receiver.wait_for(
        lambda: sum(ln.startswith("refused:") for ln in receiver.out) == len(HOSTILE), "logs"
    )
    assert list(outside.iterdir()) == []
    assert [p.name for p in dest.iterdir()] == ["escape"]


def test_check_name_accepts_ordinary_names(tmp_path: Path) -> None:
    for name in ("a.txt", "dir/sub/file.tar.gz", "ünïcødé/名前.txt", ".hidden", "a..b", "...x"):
        assert str(check_name(name)) == name
        assert destination(tmp_path, name) == tmp_path.resolve() / name
    with pytest.raises(UnsafeName, match="NUL"):
        destination(tmp_path, "a\0b")


@pytest.mark.parametrize("protocol", polymux.PROTOCOLS)
async def test_transfer_over_every_format(tmp_path: Path, protocol: str) -> None:
    """Default settings; omnistreams carries each file on a pair of one-way streams."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    digests = make_files(src, 6, 600_000, seed=len(protocol))
    log: list[str] = []
    receiver = Receiver(dest, log=log.append)
    async with asyncio.timeout(30):
        server = await polymux.start_server(
            receiver.handle, "127.0.0.1", 0, protocol=protocol, **conversation_options(protocol)
        )
        async with server, await polymux.connect("127.0.0.1", server.port, protocol=protocol) as session:
            transfers = await send_files(session, collect([src]), parallel=4)
    assert [t.status for t in transfers] == ["done"] * 6, [t.error for t in transfers]
    assert all(t.sha256 == digests[t.name] for t in transfers)
    assert tree_digests(dest) == digests
    assert sum(ln.startswith("received:") for ln in log) == 6


async def test_changed_source_restarts_from_zero(tmp_path: Path) -> None:
    """A partial file that is not a prefix of the file being sent is discarded (the
    prefix hash differs): the whole file is sent again and verified."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()
    data = os.urandom(300_000)
    (src / "f.bin").write_bytes(data)
    (dest / ("f.bin" + PART_SUFFIX)).write_bytes(b"not the same prefix" * 100)
    receiver = Receiver(dest, log=lambda _line: None)
    async with asyncio.timeout(30):
        server = await polymux.start_server(receiver.handle, "127.0.0.1", 0, protocol="yamux")
        async with server, await polymux.connect("127.0.0.1", server.port, protocol="yamux") as session:
            [t] = await send_files(session, collect([src / "f.bin"]))
    assert t.status == "done" and t.resumed_from == 0 and t.sent == len(data)
    assert (dest / "f.bin").read_bytes() == data
    assert not (dest / ("f.bin" + PART_SUFFIX)).exists()
