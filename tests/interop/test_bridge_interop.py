"""``polymux bridge`` between reference implementations: a Node peer of one format drives
channels through the bridge to a Node peer of another format, which responds (the
peers of ``node/``, unchanged in what they check).

* npm ``@libp2p/mplex`` client -> bridge -> npm ``@chainsafe/libp2p-yamux`` server, and
  yamux client -> bridge -> ``@libp2p/mplex`` server (``names="drop"``: libp2p streams
  carry their name in their first line already);
* npm ``nerdbank-streams`` (MultiplexingStream v3) client -> bridge -> yamux server, and
  yamux client -> bridge -> ``nerdbank-streams`` server (``names="line"``: the channel name
  becomes the first line of the yamux stream, and back);
* ``nerdbank-streams`` client -> bridge -> npm ``multiplex`` server: names and reset text
  cross end to end, with the drivers' strict checks.

Each: 64 channels x 4 MiB echoed byte-exact (the drivers compare every byte), a
half-close (``halfclose/x``: the responder answers the byte count after the end), a reset
(``error/*``: the responder resets, the driver must see its channel fail), the big
single-channel transfer, the name check where there is one. The first runs the bridge as
a user does (``python -m polymux bridge``, unix sockets on both sides); the others in
this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import polymux

from .peers import PeerProcess, start_node, unix_path


pytestmark = [pytest.mark.interop, pytest.mark.timeout(240)]

CHANNELS = 64
SIZE = 4 << 20


@dataclass(frozen=True)
class Peer:
    """A Node peer: its script, its format on the wire, and its extra arguments."""

    script: str
    protocol: str
    args: tuple[str, ...] = ()


LIBP2P_MPLEX = Peer("mplex_peer.mjs", "mplex", ("--impl", "libp2p"))
MULTIPLEX = Peer("mplex_peer.mjs", "multiplex", ("--impl", "multiplex"))
YAMUX = Peer("yamux_peer.mjs", "yamux")
NERDBANK = Peer("mstream_peer.js", "mstream-v3", ("--version", "3"))


async def _start(node_dir: Path, peer: Peer, *args: str) -> PeerProcess:
    return PeerProcess(await start_node(node_dir / peer.script, *peer.args, *args, watchdog=180))


async def _run(
    node_dir: Path,
    tmp_path: Path,
    driver: Peer,
    responder: Peer,
    *,
    names: str,
    driver_args: tuple[str, ...] = (),
    channels: int = CHANNELS,
    size: int = SIZE,
    cli: bool = False,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, int]]:
    """Run ``driver`` -> bridge -> ``responder``; return both summaries and the bridge's
    counts (``sessions``, ``channels``, ``failed``, ``forward``, ``back``)."""
    where = ["--unix", unix_path(tmp_path)] if cli else ["--tcp", "0"]
    far = await _start(node_dir, responder, "--listen", *where, "--mode", "responder")
    started = [far]
    try:
        address = await far.listening()
        connect = (
            f"{responder.protocol}:unix:{address}" if cli else f"{responder.protocol}:tcp:127.0.0.1:{address}"
        )
        sizes = ("--channels", str(channels), "--size", str(size), *driver_args)
        if cli:
            near_path = unix_path(tmp_path)
            counts = await _through_cli(
                node_dir,
                tmp_path,
                driver,
                f"{driver.protocol}:unix:{near_path}",
                connect,
                names,
                sizes,
                started,
            )
        else:
            async with await polymux.bridge(
                f"{driver.protocol}:tcp:127.0.0.1:0", connect, names=names
            ) as bridge:
                near = await _start(
                    node_dir,
                    driver,
                    "--connect",
                    "--tcp",
                    str(bridge.listen.port),
                    "--mode",
                    "driver",
                    *sizes,
                )
                started.append(near)
                await asyncio.wait_for(near.proc.wait(), 200)
            # (leaving closed both sides of the session: the responder exits once its
            # connection is closed)
            stats = bridge.stats
            counts = {
                "sessions": stats.sessions,
                "channels": stats.channels,
                "failed": stats.failed,
                "forward": stats.bytes_forward,
                "back": stats.bytes_back,
            }
        driven = await started[1].finish(30)
        responded = await far.finish(60)
    finally:
        for peer in started:
            peer.kill()
            await peer.aclose()
    assert driven.get("ok") is True and responded.get("ok") is True, (driven, responded)
    assert driven.get("echo_ok") == channels, driven
    assert driven.get("halfclose_reply") == "300000", driven
    handled = responded["handled"]
    assert isinstance(handled, dict)
    assert handled["echo"] == channels and handled["halfclose"] == 1 and handled["error"] == 1, handled
    assert counts["sessions"] == 1, counts
    # Every echo byte crossed both ways (plus the other channels' bytes and name lines).
    assert counts["forward"] >= channels * size and counts["back"] >= channels * size, counts
    return driven, responded, counts


async def _through_cli(
    node_dir: Path,
    tmp_path: Path,
    driver: Peer,
    listen: str,
    connect: str,
    names: str,
    sizes: tuple[str, ...],
    started: list[PeerProcess],
) -> dict[str, int]:
    """The bridge as a user runs it: ``python -m polymux bridge``, stopped by SIGTERM once
    the driver is done; its counts come from its summary line."""
    log = (tmp_path / "bridge.log").open("wb")
    bridge = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polymux", "bridge", "--names", names, listen, connect,
        stdout=asyncio.subprocess.PIPE, stderr=log,
    )  # fmt: skip
    try:
        assert bridge.stdout is not None
        first = (await asyncio.wait_for(bridge.stdout.readline(), 30)).decode()
        m = re.fullmatch(r"polymux bridge: (\S+) on unix:(\S+) -> (\S+) on (\S+) \(names: (\w+)\)\n", first)
        assert m is not None, first
        near = await _start(node_dir, driver, "--connect", "--unix", m.group(2), "--mode", "driver", *sizes)
        started.append(near)
        await asyncio.wait_for(near.proc.wait(), 200)
        bridge.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(bridge.communicate(), 30)
        assert bridge.returncode == 0, (tmp_path / "bridge.log").read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            bridge.kill()
        await bridge.wait()
        log.close()
    summary = out.decode().strip().splitlines()[-1]
    m = re.fullmatch(
        r"polymux bridge: stopped; (\d+) sessions \(0 without a \S+ session\), (\d+) channels \((\d+) failed\), "
        r"([\d.]+) MiB across, ([\d.]+) MiB back",
        summary,
    )
    assert m is not None, summary
    mib = 1 << 20
    counts = {
        "sessions": int(m.group(1)),
        "channels": int(m.group(2)),
        "failed": int(m.group(3)),
        # The summary rounds to 0.1 MiB: give the rounding back.
        "forward": int((float(m.group(4)) + 0.05) * mib),
        "back": int((float(m.group(5)) + 0.05) * mib),
    }
    return counts


async def test_nerdbank_client_through_the_cli_to_a_yamux_server(node_peers: Path, tmp_path: Path) -> None:
    """MultiplexingStream v3 (nerdbank-streams) -> ``polymux bridge --names line`` over
    unix sockets -> yamux (@chainsafe/libp2p-yamux). yamux can neither refuse a stream
    nor say why it reset one: the driver accepts ``reject/x`` accepted-then-terminated
    and any reset text (``--reject reset --reset-text any``), and the text it gets names
    the yamux reset, said by the bridge."""
    driven, responded, counts = await _run(
        node_peers, tmp_path, NERDBANK, YAMUX, names="line",
        driver_args=("--reject", "reset", "--reset-text", "any"), cli=True,
    )  # fmt: skip
    assert driven["name"] == "name/héllo wörld/✓"  # a name line on yamux, and back as data
    error = driven["error_channel"]
    assert isinstance(error, dict) and "polymux bridge: yamux: " in str(error["message"]), error
    assert "reset by the peer" in str(error["message"])
    reject = driven["reject_error"]
    assert isinstance(reject, dict) and reject["accepted"] is True and reject["completion"] == "rejected"
    handled = responded["handled"]
    assert isinstance(handled, dict) and handled["name"] == 1 and handled["reject"] == 1
    assert counts["failed"] == 2  # error/ and reject/ were reset by the yamux peer


async def test_yamux_client_to_a_nerdbank_server(node_peers: Path, tmp_path: Path) -> None:
    """yamux (@chainsafe/libp2p-yamux) -> bridge (``names="line"``) -> MultiplexingStream v3
    (nerdbank-streams): the first line of each yamux stream becomes the channel name the
    nerdbank responder reacts to; its reset (with text) reaches the yamux driver as a RST."""
    driven, responded, counts = await _run(node_peers, tmp_path, YAMUX, NERDBANK, names="line")
    error = driven["error_stream"]
    assert isinstance(error, dict) and error["outcome"] == "error", error
    big = driven["big"]
    assert isinstance(big, dict) and big["reply"].startswith("33554432 "), big
    assert responded["handled"]["big"] == 1  # type: ignore[index]
    assert counts["failed"] == 1


async def test_libp2p_mplex_client_to_a_yamux_server(node_peers: Path, tmp_path: Path) -> None:
    """@libp2p/mplex -> bridge -> @chainsafe/libp2p-yamux: libp2p streams carry their name
    line themselves (``names="drop"``: the bytes cross unchanged); the yamux reset reaches
    the mplex driver as a Reset."""
    driven, responded, counts = await _run(node_peers, tmp_path, LIBP2P_MPLEX, YAMUX, names="drop")
    name = driven["name"]
    assert isinstance(name, dict) and name["reply"] == name["sent"] == "name/héllo wörld/✓", name
    error = driven["error_stream"]
    assert isinstance(error, dict) and error["outcome"] == "error", error
    assert responded["handled"]["big"] == 1  # type: ignore[index]
    assert counts["failed"] == 1


async def test_yamux_client_to_a_libp2p_mplex_server(node_peers: Path, tmp_path: Path) -> None:
    """@chainsafe/libp2p-yamux -> bridge -> @libp2p/mplex (``names="drop"``)."""
    driven, responded, counts = await _run(node_peers, tmp_path, YAMUX, LIBP2P_MPLEX, names="drop")
    error = driven["error_stream"]
    assert isinstance(error, dict) and error["outcome"] == "error", error
    lines = [entry["line"] for entry in responded["names"]]  # type: ignore[union-attr, index]
    assert f"echo/{CHANNELS - 1}" in lines and "big/x" in lines
    assert counts["failed"] == 1


async def test_nerdbank_client_to_a_multiplex_server_names_and_reset_text(
    node_peers: Path, tmp_path: Path
) -> None:
    """nerdbank-streams (v3) -> bridge -> npm multiplex: both carry names and reset text, so
    both cross end to end and the driver's strict checks hold: ``name/héllo wörld/✓``
    comes back as the multiplex responder saw its name, and ``error/boom from python``
    fails with "boom from python", the text the multiplex responder reset it with. (npm
    multiplex has no flow control and stops reading its connection while its own writes
    wait: 16 channels x 1 MiB here, within the bridge's memory budget; see docs/bridge.md.)"""
    driven, responded, counts = await _run(
        node_peers, tmp_path, NERDBANK, MULTIPLEX, names="drop", driver_args=("--reject", "reset"),
        channels=16, size=1 << 20,
    )  # fmt: skip
    assert driven["name"] == "name/héllo wörld/✓"
    error = driven["error_channel"]
    assert isinstance(error, dict) and str(error["message"]).endswith("boom from python"), error
    assert "name/héllo wörld/✓" in responded["names"]  # type: ignore[operator]
    assert counts["failed"] == 2
