"""Bulk throughput through ``polymux forward -L`` as a ratio to direct TCP and to ``ssh -L``,
in one run (quick).

Processes: a receiving process (a raw asyncio TCP sink: each connection starts with its
length in 8 bytes, the sink reads to the end and answers one byte), the two ends of
``polymux forward`` as a user runs them (``--quiet``; the near end's ``-L`` to the sink),
an ``sshd`` started for the run on a free port of 127.0.0.1 with a throwaway host key and
client key (Debian's openssh-server; its default cipher), the ``ssh -N -L`` client to it,
and this process, which sends. For each number of connections (1, 16: SIZE/16 each), the
cases run interleaved (A/B/C/A/B/C):

* ``direct``: to the sink's port;
* ``forward``: to the near end's -L port (near end -> one session -> far end -> sink);
* ``ssh``: to ssh's -L port (ssh -> sshd -> sink).

64 KiB writes with ``drain()``; the clock runs from the first write until the last
answer; fresh connections per measurement (their set-up is not timed). The median of
``--repeat`` runs is shown, with forward / direct and forward / ssh. Without
``/usr/sbin/sshd`` and ``ssh`` the ssh column says so (``apt-get install openssh-server``).

    .venv/bin/python benchmarks/bench_forward.py [--mib 64] [--repeat 3] [--protocols yamux,mstream-v3] [--uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import polymux


T = TypeVar("T")

MIB = 1 << 20
WRITE = 64 * 1024
CONNECTIONS = (1, 16)
LIMIT = 120.0
"""Seconds one measurement may take."""
ROOT = Path(__file__).resolve().parents[1]
SSHD = "/usr/sbin/sshd"


# -- the receiving process -----------------------------------------------------------------


async def _count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        expected = int.from_bytes(await reader.readexactly(8), "big")
    except asyncio.IncompleteReadError:  # a probe of the port: no measurement
        writer.close()
        return
    n = 0
    while data := await reader.read(256 * 1024):
        n += len(data)
    writer.write(b"\x01" if n == expected else b"\x00")
    writer.close()


async def _sink() -> None:
    server = await asyncio.start_server(_count, "127.0.0.1", 0)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    await stdin.read()  # until the parent closes our stdin
    server.close()


# -- the sending side ----------------------------------------------------------------------


async def _send(port: int, payload: memoryview, connections: int) -> float:
    """One measurement: seconds from the first write to the last answer."""
    part = len(payload) // connections
    pairs = [await asyncio.open_connection("127.0.0.1", port) for _ in range(connections)]
    try:

        async def one(i: int) -> None:
            reader, writer = pairs[i]
            writer.write(part.to_bytes(8, "big"))
            view = payload[i * part : (i + 1) * part]
            for off in range(0, part, WRITE):
                writer.write(view[off : off + WRITE])
                await writer.drain()
            writer.write_eof()
            if await reader.read(1) != b"\x01":
                raise RuntimeError("the sink counted another size")

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(connections)))
        return time.perf_counter() - start
    finally:
        for _reader, writer in pairs:
            writer.close()


def _run(coro: Coroutine[Any, Any, T], use_uvloop: bool) -> T:
    if use_uvloop:
        import uvloop

        result: T = uvloop.run(coro)
        return result
    return asyncio.run(coro)


async def _line(proc: asyncio.subprocess.Process, prefix: str) -> str:
    assert proc.stdout is not None
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        if not line:
            raise RuntimeError(f"the process ended before a line starting {prefix!r}")
        if line.startswith(prefix):
            return line.strip()


async def _start_forward(
    protocol: str, sink: int, loop: list[str]
) -> tuple[list[asyncio.subprocess.Process], int]:
    """Both ends of ``polymux forward``; the near end's -L port."""
    far = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polymux", "forward", "--quiet", *loop, "--protocol", protocol,
        "--listen", "127.0.0.1:0", "--allow", f"127.0.0.1:{sink}",
        stdout=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    where = (await _line(far, "listening ")).split()[1]
    near = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polymux", "forward", "--quiet", *loop, "--protocol", protocol,
        "--connect", where, "-L", f"0:127.0.0.1:{sink}",
        stdout=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    line = await _line(near, "listening -L ")
    return [far, near], int(line.split()[2].rpartition(":")[2])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _wait_port(port: int, proc: asyncio.subprocess.Process, what: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            _r, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on {port}") from None
            await asyncio.sleep(0.05)  # polling a port another process opens
            continue
        writer.close()
        return


async def _start_ssh(folder: Path, sink: int) -> tuple[list[asyncio.subprocess.Process], int, str]:
    """An sshd on a free port with throwaway keys, and ``ssh -N -L`` through it; its -L port
    and what it negotiated (the cipher)."""
    ssh, keygen = shutil.which("ssh"), shutil.which("ssh-keygen")
    if shutil.which(SSHD) is None or ssh is None or keygen is None:
        raise RuntimeError("no sshd or ssh (apt-get install openssh-server openssh-client)")
    for name in ("host", "client"):
        await asyncio.to_thread(
            subprocess.run,
            [keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)],
            check=True,
            timeout=30,
        )
    (folder / "authorized_keys").write_text((folder / "client.pub").read_text())
    os.chmod(folder / "authorized_keys", 0o600)
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    port = _free_port()
    config = folder / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {folder / 'host'}\nPidFile {folder / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nAllowTcpForwarding yes\n"
        "PermitRootLogin prohibit-password\nLogLevel ERROR\n"
    )
    sshd = await asyncio.create_subprocess_exec(
        SSHD, "-D", "-e", "-f", str(config), stderr=asyncio.subprocess.DEVNULL
    )
    await _wait_port(port, sshd, "sshd")
    local = _free_port()
    client = await asyncio.create_subprocess_exec(
        ssh, "-N", "-p", str(port), "-i", str(folder / "client"), "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=no", "-o", f"UserKnownHostsFile={folder / 'known_hosts'}",
        "-o", "ExitOnForwardFailure=yes", "-o", "LogLevel=ERROR",
        "-L", f"127.0.0.1:{local}:127.0.0.1:{sink}", f"{getpass.getuser()}@127.0.0.1",
    )  # fmt: skip
    await _wait_port(local, client, "ssh -L")
    query = await asyncio.to_thread(
        subprocess.run,
        [ssh, "-G", "-p", str(port), "127.0.0.1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    ciphers = next((ln.split()[1] for ln in query.stdout.splitlines() if ln.startswith("ciphers ")), "?")
    return [sshd, client], local, ciphers.split(",")[0]


async def _stop(procs: list[asyncio.subprocess.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
    for proc in procs:
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def measure(
    protocols: list[str], size: int, repeat: int, use_uvloop: bool = False
) -> tuple[list[dict[str, object]], str]:
    """Every row's runs, interleaved; one dict per (protocol, connections), and a note on ssh."""
    loop = ["--uvloop"] if use_uvloop else []
    sink = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__)), "--sink", *loop,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    sink_port = int((await _line(sink, "PORT ")).split()[1])
    started: list[asyncio.subprocess.Process] = []
    ports: dict[str, int] = {"direct": sink_port}
    note = ""
    payload = memoryview(bytes(size))
    runs: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="pmx-ssh-") as tmp:
        try:
            for protocol in protocols:
                procs, port = await _start_forward(protocol, sink_port, loop)
                started += procs
                ports[f"forward {protocol}"] = port
            try:
                procs, port, cipher = await _start_ssh(Path(tmp), sink_port)
                started += procs
                ports["ssh"] = port
                note = f"ssh -L: OpenSSH, cipher {cipher}"
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                note = f"ssh -L not measured: {exc}"
            for _ in range(repeat):
                for connections in CONNECTIONS:
                    for case, port in ports.items():
                        async with asyncio.timeout(LIMIT):
                            runs.setdefault((case, connections), []).append(
                                await _send(port, payload, connections)
                            )
        finally:
            await _stop(started)
            if sink.stdin is not None:
                sink.stdin.close()
            await _stop([sink])
    rows: list[dict[str, object]] = []
    for protocol in protocols:
        for connections in CONNECTIONS:

            def rate(case: str, connections: int = connections) -> float | None:
                times = runs.get((case, connections))
                return size / MIB / statistics.median(times) if times else None

            forward, direct, ssh = rate(f"forward {protocol}"), rate("direct"), rate("ssh")
            assert forward is not None and direct is not None
            rows.append(
                {
                    "protocol": protocol,
                    "connections": connections,
                    "direct_mib_s": round(direct, 1),
                    "forward_mib_s": round(forward, 1),
                    "ssh_mib_s": None if ssh is None else round(ssh, 1),
                    "vs_direct": round(forward / direct, 2),
                    "vs_ssh": None if ssh is None else round(forward / ssh, 2),
                }
            )
    return rows, note


def report(rows: list[dict[str, object]], note: str, size: int, repeat: int, loop: str) -> None:
    print(
        f"polymux {polymux.__version__}, Python {platform.python_version()}, {platform.machine()}, {loop}; "
        f"{size // MIB} MiB per measurement, median of {repeat}; {note}"
    )
    print(
        "| format | connections | direct TCP | polymux forward -L | ssh -L | forward / direct | forward / ssh |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ssh = "-" if r["ssh_mib_s"] is None else f"{r['ssh_mib_s']} MiB/s"
        vs_ssh = "-" if r["vs_ssh"] is None else f"{r['vs_ssh']}x"
        print(
            f"| {r['protocol']} | {r['connections']} | {r['direct_mib_s']} MiB/s | {r['forward_mib_s']} MiB/s | "
            f"{ssh} | {r['vs_direct']}x | {vs_ssh} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=64, help="MiB moved per measurement (default 64)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row; the median counts (default 3)")
    parser.add_argument(
        "--protocols", default="yamux", help="formats of the forward, comma-separated (default yamux)"
    )
    parser.add_argument(
        "--uvloop", action="store_true", help="run the sink, both ends and the sender on uvloop"
    )
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON object")
    parser.add_argument("--sink", action="store_true", help=argparse.SUPPRESS)  # the receiving process
    args = parser.parse_args()
    if args.sink:
        _run(_sink(), args.uvloop)
        return
    protocols = args.protocols.split(",")
    for protocol in protocols:
        if protocol not in polymux.PROTOCOLS:
            parser.error(f"--protocols: unknown format {protocol!r}")
    if args.mib <= 0 or args.repeat <= 0:
        parser.error("--mib and --repeat must be positive")
    size = args.mib * MIB - (args.mib * MIB) % (max(CONNECTIONS) * WRITE)
    rows, note = _run(measure(protocols, size, args.repeat, args.uvloop), args.uvloop)
    if args.json:
        print(json.dumps({"rows": rows, "note": note}))
    else:
        report(rows, note, size, args.repeat, "uvloop" if args.uvloop else "asyncio")


if __name__ == "__main__":
    main()
