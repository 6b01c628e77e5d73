"""A bridge in a process of its own that reports its memory when asked (the slow-reader
test, ``test_backpressure.py``).

    python memory_probe.py LISTEN CONNECT OPTIONS_JSON

Prints ``READY <port>``, then reads commands on stdin, one a line: ``mark`` (start
measuring: tracemalloc's peak and the kernel's peak RSS are reset), ``report`` (prints one
JSON line: ``traced_peak`` and ``traced_now``, bytes above the mark by tracemalloc;
``hwm_growth``, the peak RSS above the RSS at the mark, from /proc/self/status), ``stop``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tracemalloc

import polymux


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
    listen, connect, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    tracemalloc.start()
    bridge = await polymux.bridge(listen, connect, **options)
    print(f"READY {bridge.listen.port}", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    traced_base = rss_base = 0
    while command := (await reader.readline()).strip():
        if command == b"mark":
            rss_base = _reset_peak_rss()
            tracemalloc.reset_peak()
            traced_base = tracemalloc.get_traced_memory()[0]
        elif command == b"report":
            now, peak = tracemalloc.get_traced_memory()
            report = {
                "traced_peak": peak - traced_base,
                "traced_now": now - traced_base,
                "hwm_growth": _status("VmHWM") - rss_base,
                "stats": vars(bridge.stats),
            }
            print(json.dumps(report), flush=True)
        elif command == b"stop":
            break
    bridge.close()
    await bridge.wait_closed()


if __name__ == "__main__":
    # Never in asyncio's debug mode, which the test suite turns on (PYTHONASYNCIODEBUG) and
    # this process inherits: its source tracebacks on every handle and task doubled what
    # tracemalloc saw (25 -> 49-59 MiB for 1,024 bridged channels), measuring the debugger,
    # not the bridge a user runs.
    asyncio.run(main(), debug=False)
