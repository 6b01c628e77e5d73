"""A polymux server in a process of its own, for the tests that measure its RSS while a
hostile peer attacks it (tests/hostile/test_bounds.py).

Usage: ``python server_proc.py '{"protocol": "yamux", "mode": "echo", "options": {...}}'``.
It prints ``PORT <n>`` once it listens, then one line per event:

* ``SESSION <n>``: a session's connection was made (n sessions live);
* ``CLOSED <seconds> <live> <exception>``: a session's connection is gone (seconds since
  the session began; live sessions left; why it ended, ``None`` for a clean end).

``"websocket": true`` serves on WebSocket (``serve_websocket``) instead of plain TCP.
It stops when its stdin closes. ``"lenient": true`` drops options the running
polymux does not know (the benchmark runs it against older versions too). ``mode``: ``echo`` (every channel's bytes back),
``hold`` (channels are taken and never read), ``discard`` (read and drop).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
import time
from typing import Any

import polymux


async def main(spec: dict[str, Any]) -> None:
    mode = spec.get("mode", "echo")
    never = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, polymux.PolymuxError):
            if mode == "hold":
                await never.wait()
            while data := await reader.read(65536):
                if mode == "echo":
                    writer.write(data)
                    await writer.drain()
            writer.close()

    live = 0

    def session_handler(session: polymux.Session) -> None:
        nonlocal live
        live += 1
        start = time.monotonic()
        print(f"SESSION {live}", flush=True)

        def gone(_f: object) -> None:
            nonlocal live
            live -= 1
            why = repr(session.exception).replace("\n", " ")
            print(f"CLOSED {time.monotonic() - start:.3f} {live} {why}", flush=True)

        session.mux.closed.add_done_callback(gone)

    options = spec.get("options", {})
    if spec.get("lenient"):  # benchmarks against older versions: drop options they lack
        known = {f.name for f in dataclasses.fields(polymux.SessionConfig)}
        options = {k: v for k, v in options.items() if k in known}
    serve = polymux.serve_websocket if spec.get("websocket") else polymux.start_server
    server = await serve(
        handler,
        "127.0.0.1",
        0,
        protocol=spec["protocol"],
        session_handler=session_handler,
        **options,
    )
    print(f"PORT {server.port}", flush=True)
    loop = asyncio.get_running_loop()
    stdin_closed = loop.create_future()

    def watch_stdin() -> None:
        sys.stdin.read()
        loop.call_soon_threadsafe(stdin_closed.set_result, None)

    loop.run_in_executor(None, watch_stdin)
    await stdin_closed
    never.set()
    server.close()


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    if spec.get("uvloop"):
        import uvloop

        uvloop.run(main(spec))
    else:
        asyncio.run(main(spec))
