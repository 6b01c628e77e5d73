"""``polymux bridge`` as a user runs it: ``polymux connect`` in one format through the bridge
to ``polymux serve`` in another, captures of both sides, the first line and the summary,
SIGTERM, and the errors and exit statuses of the other subcommands."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

import polymux
from polymux.apps.common import EXIT_STATUS
from polymux.cli import main

from .procs import Proc, Procs
from .test_serve_connect import serve


FIRST = re.compile(r"polymux bridge: (\S+) on (tcp|unix):(\S+) -> (\S+) on (\S+) \(names: (\w+)\)")


async def bridge(procs: Procs, *args: str) -> tuple[Proc, str]:
    """Start ``polymux bridge``; return it and the address it listens on."""
    proc = await procs.polymux("bridge", *args)
    m = await proc.line(FIRST.pattern)
    return proc, m.group(3)


async def test_connect_through_the_bridge_to_serve(procs: Procs, short_tmp: Path) -> None:
    """mplex client -> bridge -> yamux echo server: every byte verified; both sides
    captured; SIGTERM prints the summary and exits 0."""
    _server, far = await serve(procs, "yamux", "--tcp", "127.0.0.1:0")
    near_dir, far_dir = short_tmp / "near", short_tmp / "far"
    proc, addr = await bridge(
        procs, "mplex:tcp:127.0.0.1:0", f"yamux:tcp:{far}",
        "--capture-listen", str(near_dir), "--capture-connect", str(far_dir),
    )  # fmt: skip
    assert re.fullmatch(
        rf"polymux bridge: mplex on tcp:127\.0\.0\.1:\d+ -> yamux on tcp:{far} \(names: drop\)", proc.out[0]
    )
    client = await procs.polymux(
        "connect", "--protocol", "mplex", "--tcp", addr, "--channels", "4", "--size", "1MiB", "--json"
    )
    assert await client.wait() == 0, client.describe() + proc.describe()
    summary = json.loads(client.out[-1])
    assert summary["verified"] is True and summary["echoed"] == 4 << 20
    await proc.wait_for(lambda: len([ln for ln in proc.err if "bytes back" in ln]) == 4, "4 channel lines")
    assert all(" ok" in ln for ln in proc.err if "bytes back" in ln), proc.stderr
    proc.send_signal(signal.SIGTERM)
    assert await proc.wait() == 0, proc.describe()
    assert re.search(
        r"stopped; 1 sessions \(0 without a yamux session\), 4 channels \(0 failed\), 4\.0 MiB across, 4\.0 MiB back",
        proc.stdout,
    ), proc.stdout
    from polymux.tracing import read_capture

    near = [read_capture(p) for p in near_dir.glob("*.pmcap.parquet")]
    far_caps = [read_capture(p) for p in far_dir.glob("*.pmcap.parquet")]
    assert [(c.format, c.role) for c in near] == [("mplex", "server")]
    assert [(c.format, c.role) for c in far_caps] == [("yamux", "client")]


@pytest.mark.parametrize(
    ("near", "said"),
    [
        # Formats whose resets carry text: the reason itself.
        ("mstream-v3", "was reset by the peer: polymux bridge: no session with yamux:tcp:127.0.0.1:{port}: "),
        ("multiplex", "was reset by the peer: polymux bridge: no session with yamux:tcp:127.0.0.1:{port}: "),
        # Formats without: each channel reset (the reason is in the bridge's log), not a
        # connection closed before a byte.
        ("yamux", "was reset by the peer"),
        ("mplex", "was reset by the peer"),
    ],
)
async def test_a_client_of_the_bridge_learns_why_when_connect_is_down(
    procs: Procs, near: str, said: str
) -> None:
    """CONNECT refuses at once, before the client opened its channels: they are reset with
    the reason, not met by a closed connection ("the peer sent nothing back")."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _proc, addr = await bridge(procs, f"{near}:tcp:127.0.0.1:0", f"yamux:tcp:127.0.0.1:{port}")
    client = await procs.polymux("connect", "--protocol", near, "--tcp", addr, "--size", "64KiB")
    assert await client.wait() == 1, client.describe()
    assert said.format(port=port) in client.stderr, client.stderr
    assert "without sending a byte" not in client.stderr and "nothing back" not in client.stderr


async def test_no_session_on_the_connecting_side(procs: Procs, short_tmp: Path) -> None:
    """Nothing listens on CONNECT: the client's channels fail (exit 1), the bridge goes on
    and counts it; unix sockets; its socket file is removed when it stops."""
    path = short_tmp / "bridge.sock"
    proc, _addr = await bridge(procs, f"yamux:unix:{path}", f"mstream-v3:unix:{short_tmp / 'nobody'}")
    client = await procs.polymux(
        "connect", "--protocol", "yamux", "--unix", str(path), "--channels", "2", "--size", "64KiB"
    )
    assert await client.wait() == 1, client.describe()
    await proc.line("no session with mstream-v3:unix:", stream="err")
    proc.send_signal(signal.SIGTERM)
    assert await proc.wait() == 0
    assert "1 sessions (1 without a mstream-v3 session)" in proc.stdout
    assert not path.exists()


async def test_errors_and_exit_codes(procs: Procs) -> None:
    for args, message in [
        (["nope:tcp:127.0.0.1:0", "yamux:tcp:127.0.0.1:1"], "unknown format 'nope'"),
        (["yamux:tcp:127.0.0.1", "mplex:tcp:127.0.0.1:1"], "expected tcp:HOST:PORT"),
        (["yamux:udp:1", "mplex:tcp:127.0.0.1:1"], "unknown transport 'udp'"),
        (["yamux:tcp:127.0.0.1:0", "mplex:tcp:127.0.0.1:0"], "a port is needed to connect"),
        (["omnistreams:wss://127.0.0.1:0/", "mplex:tcp:127.0.0.1:1"], "listens on ws:// only"),
        (["yamux:tcp:127.0.0.1:0", "mplex:tcp:127.0.0.1:1", "--names", "keep"], "invalid choice: 'keep'"),
        (["yamux:tcp:127.0.0.1:0", "mplex:tcp:127.0.0.1:1", "--idle-timeout", "-1"], "must be positive"),
        (["yamux:tcp:127.0.0.1:0", "mplex:tcp:127.0.0.1:1", "--window", "lots"], "not a size: 'lots'"),
    ]:
        bad = await procs.polymux("bridge", *args)
        assert await bad.wait() == 2, (args, bad.describe())
        assert message in bad.stderr, (args, bad.stderr)
    # The port is taken: the bridge cannot listen, exit 1.
    first, addr = await bridge(procs, "mplex:tcp:127.0.0.1:0", "yamux:tcp:127.0.0.1:1")
    second = await procs.polymux("bridge", f"mplex:tcp:{addr}", "yamux:tcp:127.0.0.1:1")
    assert await second.wait() == 1
    assert f"cannot listen on tcp:{addr}" in second.stderr
    first.send_signal(signal.SIGTERM)
    assert await first.wait() == 0


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bridge", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: polymux bridge")
    assert out.rstrip().endswith(EXIT_STATUS.rstrip())
    for option in ("--names", "--max-connections", "--max-session-memory", "--handshake-timeout",
                   "--idle-timeout", "--keepalive-interval", "--capture-listen", "--capture-connect"):  # fmt: skip
        assert option in out
    assert set(polymux.bridging.NAME_POLICIES) <= set(re.findall(r"\b(drop|line)\b", out))
