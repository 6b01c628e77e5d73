"""A transcript of what the data plane does with given bytes: run in a process of its own,
once on the compiled path and once with ``POLYMUX_NO_EXTENSIONS=1``, by
``tests/test_speedups.py``, which requires the two to be the same, line for line.

For every format and every input of the fuzz corpus (recorded sessions: a control byte and
the bytes a peer sent, see ``fuzz/polymux_fuzz.py``), split in two at many offsets and in
pieces of several sizes, a session core (engine, data plane, inboxes) takes the bytes as a
driver would: it reads half of the incoming channels through their inboxes (the data
plane's fast path) and the other half through events, takes some of what the inboxes hold
(credit goes back as it is reported), answers on every channel, and ends the channels the
peer ended. A line per run: the format, the input, the split, and a digest of every event,
every byte sent, and every inbox's contents and counts after each piece.

    python tests/speedups_transcript.py [--quick]
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fuzz"))

from polymux_fuzz import CONFIG, CORPUS, new_engine

import polymux
from polymux import _speedups
from polymux.exceptions import PolymuxError
from polymux.session import SessionCore, events as ce


def _norm(value: object) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return "b" + hashlib.sha256(bytes(value)).hexdigest()[:16] + f"/{len(value)}"
    if isinstance(value, BaseException):
        return f"{type(value).__name__}({value})"
    if isinstance(value, tuple):
        return "(" + ",".join(_norm(v) for v in value) + ")"
    return repr(value)


def _event(event: ce.CoreEvent) -> str:
    fields = dataclasses.fields(event)  # type: ignore[arg-type]
    return type(event).__name__ + "(" + ",".join(_norm(getattr(event, f.name)) for f in fields) + ")"


def _pieces(payload: bytes, split: str) -> Iterator[bytes]:
    kind, _, value = split.partition("=")
    n = int(value)
    if kind == "at":
        yield payload[:n]
        yield payload[n:]
    else:
        for i in range(0, len(payload), n):
            yield payload[i : i + n]


def run(fmt: str, data: bytes, split: str) -> str:
    """One run's digest (see the module docstring)."""
    digest = hashlib.sha256()
    ctl, payload = data[0], data[1:]
    is_client = bool(ctl & 1)
    engine = new_engine(fmt, is_client=is_client)
    core = SessionCore(engine, CONFIG, 0.0, has_handler=True)
    core.connection_made(0.0)
    streamed: dict[int, object] = {}
    now = 0.0
    for piece in _pieces(payload, split):
        now += 0.25
        try:
            core.receive_data(piece, now)
        except PolymuxError as exc:  # pragma: no cover - the core reports, never raises
            digest.update(f"raised {type(exc).__name__}: {exc}\n".encode())
            break
        for event in core.events():
            digest.update(_event(event).encode() + b"\n")
            handle = getattr(event, "handle", None)
            if isinstance(event, ce.Incoming) and handle is not None and handle % 2 == 0:
                inbox = core.stream(handle, owner=None)
                if inbox is not None:
                    streamed[handle] = inbox
            elif isinstance(event, ce.Data):
                core.consumed(event.handle, event.n, now)
            if isinstance(event, ce.Incoming | ce.Accepted) and handle in core.channels:
                try:
                    core.write(handle, b"answer %d" % handle)
                except PolymuxError as exc:
                    digest.update(f"write {type(exc).__name__}: {exc}\n".encode())
            if isinstance(event, ce.Ended) and handle in core.channels:
                core.write_eof(handle)
        woken = core.runs.woken
        digest.update(f"woken {[i.handle for i in woken]}\n".encode())
        woken.clear()
        for handle, inbox in sorted(streamed.items()):
            state = (inbox.size, inbox.unconsumed, inbox.pending, len(inbox.parts))  # type: ignore[attr-defined]
            digest.update(f"inbox {handle} {state}\n".encode())
            if inbox.size and handle % 4 == 0:  # type: ignore[attr-defined]
                digest.update(_norm(inbox.take(4096)).encode())  # type: ignore[attr-defined]
        core.report(now)
        while out := core.data_to_send():
            digest.update(b"out " + _norm(b"".join(bytes(c) for c in out)).encode() + b"\n")
        if core.failed:
            digest.update(f"failed {_norm(core.error)}\n".encode())
            break
    return digest.hexdigest()[:24]


def splits(size: int, quick: bool) -> list[str]:
    """Where an input of ``size`` bytes is cut: at every offset of its first bytes (and
    further on at a stride), and in pieces of 1, 7, 64 and 4096 bytes."""
    first = 96 if quick else 512
    stride = 997 if quick else 127
    cuts = list(range(1, min(size, first))) + list(range(first, size, stride))
    return [f"at={n}" for n in cuts] + [f"by={n}" for n in (1, 7, 64, 4096)]


def main() -> None:
    quick = "--quick" in sys.argv
    print(f"# path: {_speedups.path()}")
    for fmt in polymux.PROTOCOLS:
        folder = os.path.join(CORPUS, fmt)
        for name in sorted(os.listdir(folder)):
            data = Path(folder, name).read_bytes()
            if len(data) < 2:
                continue
            for split in splits(len(data) - 1, quick):
                print(fmt, name, split, run(fmt, data, split), flush=False)


if __name__ == "__main__":
    main()
