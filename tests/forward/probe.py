"""A near end and a far end in a process of their own that report their memory when
asked (the backpressure test, ``test_backpressure.py``).

    python probe.py PROTOCOL TARGET_PORT OPTIONS_JSON

Prints ``READY <-L port>``, then reads commands on stdin, one a line: ``mark`` (the
kernel's peak RSS is reset), ``report`` (one JSON line: ``hwm_growth``, the peak RSS
above the RSS at the mark, from /proc/self/status, and both ends' stats), ``stop``.
"""

from __future__ import annotations

import asyncio
import json
import sys

from polymux.forward import start_far_end, start_near_end


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak_rss() -> int:
    """Reset the kernel's peak RSS (VmHWM) to the current RSS, and return that."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    return _status("VmRSS")


async def main() -> None:
    protocol, target, options = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    far = await start_far_end(f"{protocol}:tcp:127.0.0.1:0", allow=[f"127.0.0.1:{target}"], **options)
    near = await start_near_end(
        f"{protocol}:tcp:127.0.0.1:{far.endpoint.port}", local=[f"0:127.0.0.1:{target}"], **options
    )
    print(f"READY {near.forwards[0].bind.port}", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    base = 0
    while command := (await reader.readline()).strip():
        if command == b"mark":
            base = _reset_peak_rss()
        elif command == b"report":
            report = {"hwm_growth": _status("VmHWM") - base, "near": vars(near.stats), "far": vars(far.stats)}
            print(json.dumps(report), flush=True)
        elif command == b"stop":
            break
    near.close()
    far.close()
    await near.wait_closed()
    await far.wait_closed()


if __name__ == "__main__":
    # Not in asyncio's debug mode, which the suite turns on and this process inherits: its
    # tracebacks on every handle would be measured, not the forward a user runs.
    asyncio.run(main(), debug=False)
